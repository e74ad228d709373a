"""Non-finite training: temperature 0 is refused at load, skipped steps are counted, and a run
that keeps skipping them stops with a message that says why."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.config import ConfigError, load_config
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.nonfinite import NonFiniteStepGuard, NonFiniteStepsError
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate


def test_training_temperature_zero_is_refused_with_the_reason_and_the_greedy_knob() -> None:
    for value in ("0", "-0.5", ".nan"):
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"rollout.temperature={value}"])
        message = str(info.value)
        assert "rollout.temperature: must be > 0 for training" in message
        assert "NaN" in message and "rollout.val_temperature=0" in message
    config = load_config(None, ["rollout.temperature=0.3", "rollout.val_temperature=0"])
    assert config.rollout.temperature == 0.3 and config.rollout.val_temperature == 0.0  # greedy validation


def test_max_nonfinite_steps_in_row_is_a_positive_count() -> None:
    assert ActorConfig().max_nonfinite_steps_in_row == 3
    with pytest.raises(ConfigError, match="actor.max_nonfinite_steps_in_row: got 0"):
        load_config(None, ["actor.max_nonfinite_steps_in_row=0"])


def _batch(engine: TorchTrainingEngine, advantage: float) -> dict[str, torch.Tensor]:
    """Four trajectories "i+1=" -> "<digits>"; old log-probs a little away from the policy's."""
    tok = engine.tokenizer
    records = []
    for i in range(4):
        prompt = [tok.bos_token_id, *tok.encode(f"{i}+1=", add_special_tokens=False)]
        response = tok.encode(str(i + 1), add_special_tokens=False) + [tok.eos_token_id]
        records.append(
            {
                "prompt_ids": prompt,
                "response_ids": response,
                "old_log_probs": [-1.0] * len(response),
                "advantages": [advantage if i == 0 else (i - 1.5)] * len(response),
            }
        )
    return collate(records, int(tok.pad_token_id), ["old_log_probs", "advantages"])


def _weights(engine: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.model.named_parameters()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def test_a_nan_advantage_skips_the_step_and_reports_it(tiny_model_dir: Path) -> None:
    cfg = ActorConfig(lr=1e-2)
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    loss_fn = build_actor_loss_fn(cfg)
    before = _weights(engine)
    metrics = engine.train_batch(_batch(engine, math.nan), loss_fn)
    assert metrics["actor/nonfinite_steps"] == 1.0 and math.isnan(float(metrics["actor/grad_norm"]))
    after = _weights(engine)
    _assert_same(before, after)  # skipped: the weights did not move, and stay finite
    assert all(torch.isfinite(t).all() for t in after.values())
    metrics = engine.train_batch(_batch(engine, 1.0), loss_fn)
    assert metrics["actor/nonfinite_steps"] == 0.0 and math.isfinite(float(metrics["actor/grad_norm"]))
    assert any(not torch.equal(t, before[n]) for n, t in _weights(engine).items())  # a real step


def test_temperature_zero_would_make_every_step_nonfinite(tiny_model_dir: Path) -> None:
    """Why the config refuses it: the training log-probs divide the logits by the temperature."""
    cfg = ActorConfig()
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10, temperature=0.0)
    metrics = engine.train_batch(_batch(engine, 1.0), build_actor_loss_fn(cfg))
    assert metrics["actor/nonfinite_steps"] == 1.0


def test_guard_counts_skips_in_a_row_and_stops_at_the_limit() -> None:
    guard = NonFiniteStepGuard(max_in_row=3)
    for skipped, in_row in [(True, 1), (True, 2), (False, 0), (True, 1), (True, 2)]:
        guard.record(skipped)
        assert guard.in_row == in_row  # a finite step resets the count
    with pytest.raises(NonFiniteStepsError) as info:
        guard.record(True)
    message = str(info.value)
    assert message.startswith("3 optimizer steps in a row had a non-finite (NaN/inf) gradient norm")
    assert "actor.max_nonfinite_steps_in_row = 3" in message
    assert "advantages or rewards" in message and "actor.lr" in message


def test_guard_with_limit_one_stops_at_the_first_skip() -> None:
    guard = NonFiniteStepGuard(max_in_row=1)
    guard.record(False)
    with pytest.raises(NonFiniteStepsError, match="^1 optimizer steps in a row"):
        guard.record(True)
