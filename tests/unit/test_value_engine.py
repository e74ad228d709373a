"""The critic's value engine (engines/training/value_engine.py) on the tiny policy, CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.algorithms.critic_loss import build_critic_loss_fn
from rl_train.engines.training.critic_config import CriticConfig
from rl_train.engines.training.value_engine import TorchValueEngine
from rl_train.storage.records import collate, scatter_response


def records() -> list[dict[str, Any]]:
    """Three trajectories of different lengths (right padding in a batch)."""
    return [
        {"prompt_ids": [1, 5, 6], "response_ids": [7, 8, 2]},
        {"prompt_ids": [1, 9], "response_ids": [4]},
        {"prompt_ids": [1, 9, 9, 7, 8], "response_ids": [9, 10, 11, 2]},
    ]


def engine(model_dir: Path, **critic: Any) -> TorchValueEngine:
    return TorchValueEngine(model_dir, CriticConfig(**{"lr_warmup_steps": 0, **critic}), seed=0)


def with_targets(rows: list[dict[str, Any]], old: list[list[float]], returns: list[list[float]]):
    return [{**r, "values": o, "returns": g} for r, o, g in zip(rows, old, returns, strict=True)]


def test_values_start_at_zero_and_cover_every_position(tiny_model_dir: Path) -> None:
    # The head is zero-initialised: V = 0 everywhere before any update, on the batch's [B, T].
    values_engine = engine(tiny_model_dir)
    batch = collate(records(), pad_token_id=0)
    values = values_engine.compute_values(batch)
    assert values.shape == batch["input_ids"].shape
    assert torch.count_nonzero(values) == 0


def test_values_are_causal_and_unaffected_by_padding(tiny_model_dir: Path) -> None:
    values_engine = engine(tiny_model_dir)
    torch.nn.init.normal_(values_engine.model.value_head.weight, std=1.0)  # non-trivial values
    rows = records()
    batched = scatter_response(values_engine.compute_values(collate(rows, 0)), rows)
    # Each row alone (no padding) gives the same per-token values as inside the padded batch.
    for row, in_batch in zip(rows, batched, strict=True):
        alone = scatter_response(values_engine.compute_values(collate([row], 0)), [row])[0]
        assert alone == pytest.approx(in_batch, abs=1e-5)
    # V at response token t reads the prefix before t: changing the last token moves no value,
    # changing the first response token moves every later one.
    row = rows[0]
    base = scatter_response(values_engine.compute_values(collate([row], 0)), [row])[0]
    last = {**row, "response_ids": [7, 8, 3]}
    first = {**row, "response_ids": [4, 8, 2]}
    assert scatter_response(values_engine.compute_values(collate([last], 0)), [last])[0] == base
    moved = scatter_response(values_engine.compute_values(collate([first], 0)), [first])[0]
    assert moved[0] == base[0] and moved[1] != pytest.approx(base[1], abs=1e-6)


def test_value_loss_decreases_on_a_fixed_batch(tiny_model_dir: Path) -> None:
    # Returns 1 on the first trajectory, 0 elsewhere; V_old is refreshed each step, as the
    # phases do. No two trajectories share a prefix, so the values can fit the returns exactly.
    values_engine = engine(tiny_model_dir, lr=3e-3)
    loss_fn = build_critic_loss_fn(values_engine.cfg)
    rows = records()
    returns = [[float(i == 0)] * len(r["response_ids"]) for i, r in enumerate(rows)]
    losses = []
    for _ in range(25):
        old = scatter_response(values_engine.compute_values(collate(rows, 0)), rows)
        batch = collate(with_targets(rows, old, returns), 0, ["values", "returns"])
        losses.append(values_engine.train_batch(batch, loss_fn)["critic/vf_loss"])
    # At V = 0: 0.5 * (1^2 x 3 tokens) / 8 tokens = 0.1875.
    assert losses[0] == pytest.approx(0.1875, rel=1e-5)
    assert min(losses[-5:]) < 0.1 * losses[0]
    fitted = scatter_response(values_engine.compute_values(collate(rows, 0)), rows)
    others = fitted[1] + fitted[2]
    assert sum(fitted[0]) / 3 - sum(others) / len(others) > 0.5  # the 1-return trajectory stands out


def test_update_does_not_depend_on_the_micro_batch_split(tiny_model_dir: Path) -> None:
    # numerators are summed and divided once by the global token count, so one
    # micro-batch per sample gives the gradient of the whole batch (compared before Adam,
    # which would blow float rounding of near-zero gradients up to +-lr).
    rows = records()
    old = [[0.1] * len(r["response_ids"]) for r in rows]
    returns = [[float(i)] * len(r["response_ids"]) for i, r in enumerate(rows)]
    runs = []
    for micro in (None, 1):
        values_engine = engine(tiny_model_dir, micro_batch_size=micro)
        torch.nn.init.constant_(values_engine.model.value_head.weight, 0.1)  # the backbone gets gradient too
        batch = collate(with_targets(rows, old, returns), 0, ["values", "returns"])
        metrics = values_engine.train_batch(batch, build_critic_loss_fn(values_engine.cfg))
        runs.append((metrics, [p.grad.clone() for p in values_engine.model.parameters()]))
    (whole, whole_grads), (split, split_grads) = runs
    assert split["critic/vf_loss"] == pytest.approx(whole["critic/vf_loss"], rel=1e-6)
    assert split["critic/grad_norm"] == pytest.approx(whole["critic/grad_norm"], rel=1e-5)
    for a, b in zip(whole_grads, split_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_value_head_starts_from_the_policy_backbone(tiny_model_dir: Path) -> None:
    from rl_train.engines.model.loading import load_policy

    policy, _ = load_policy(tiny_model_dir)
    critic = engine(tiny_model_dir).model
    torch.testing.assert_close(critic.backbone.embed_tokens.weight, policy.model.embed_tokens.weight)
    torch.testing.assert_close(
        critic.backbone.layers[0].mlp.up_proj.weight, policy.model.layers[0].mlp.up_proj.weight
    )
