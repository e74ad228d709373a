"""The single-process GRPO baseline: a short run reports what the time-to-reward bench reads,
its update moves the weights by the advantages, and its sampler lays out what it scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_train.bench import baseline_grpo
from rl_train.bench.baseline_grpo import (
    first_reaching,
    group_advantages,
    grpo_loss,
    lr_factor,
    parse_args,
    run_baseline,
)
from rl_train.engines.model.native import load_native
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.storage.builtin_data import write_builtin_task


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in policy's architecture and tokenizer, untrained (no seconds of pretraining)."""
    from rl_train.engines.model.tiny import create_tiny_policy

    return create_tiny_policy(tmp_path_factory.mktemp("model") / "tiny", seed=0, pretrain_steps=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    write_builtin_task("single_digit_sum", folder, seed=0)
    return folder


def small_args(model: Path, data: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--data-dir", str(data), "--steps", "2", "--batch", "2", "--n", "4",
            "--threads", "1", *extra]  # fmt: skip


def test_two_steps_report_the_summary(policy_dir: Path, data_dir: Path) -> None:
    summary = run_baseline(parse_args(small_args(policy_dir, data_dir, "--kl-coef", "0.02")))
    assert len(summary["rewards"]) == 2 and all(0.0 <= r <= 1.0 for r in summary["rewards"])
    assert summary["steps_to_target"] is None and summary["seconds_to_target"] is None  # a window needs 10 steps
    assert summary["plateau"] == pytest.approx(sum(summary["rewards"]) / 2)
    assert 0 < summary["first_step_s"] <= summary["total_s"]
    assert (summary["batch"], summary["n"], summary["model_impl"]) == (2, 4, "native")
    json.dumps(summary)  # what --json prints


def test_json_flag_prints_one_line_of_summary(policy_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert baseline_grpo.main(small_args(policy_dir, data_dir, "--steps", "1", "--json")) == 0
    out, err = capsys.readouterr()
    (line,) = out.strip().splitlines()
    assert json.loads(line)["steps"] == 1 and "step    1 | reward" in err


def test_the_update_follows_the_advantages(policy_dir: Path) -> None:
    """A group whose answers differ in reward changes the weights; one where all score the
    same has zero advantage, zero loss gradient, and leaves them as they were."""
    torch.manual_seed(0)
    model, tokenizer = load_native(policy_dir).train(), load_tokenizer(policy_dir)
    prompt = baseline_grpo.encode_prompt(tokenizer, "3+4=")
    rollout = baseline_grpo.sample(model, tokenizer, [prompt], 4, 4, 1.0, torch.Generator().manual_seed(0))
    assert rollout.sequences.shape == (4, len(prompt) + 4)
    assert rollout.response_mask.sum(-1).tolist() == [
        min(len(r) + 1, 4) for r in rollout.responses
    ]  # the answer, and its EOS where it fits
    for rewards, moves in (([1.0, 0.0, 0.0, 1.0], True), ([1.0, 1.0, 1.0, 1.0], False)):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        optimizer.zero_grad()
        advantages = group_advantages(torch.tensor([rewards])).flatten()
        log_probs = baseline_grpo.response_log_probs(model, rollout, 1.0)
        grpo_loss(log_probs, advantages, rollout.response_mask.float(), "token-mean").backward()
        optimizer.step()
        changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert changed is moves


def test_the_target_is_the_first_full_window_at_or_above_it() -> None:
    assert first_reaching([0.0] * 5 + [1.0] * 8) is None
    assert first_reaching([0.0, 0.0] + [1.0] * 10, window=10) == 11
    assert first_reaching([0.9] * 10) == 10


def test_the_schedule_warms_up_then_decays_to_its_floor() -> None:
    assert [lr_factor(s, 4, "constant", 10, 0.1) for s in (1, 2, 4, 5, 10)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    # cosine after 2 warm-up steps over steps 2..10: halfway (step 6) the factor is 0.1 + 0.9 * 0.5
    assert lr_factor(6, 2, "cosine", 10, 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 2, "cosine", 10, 0.1) == pytest.approx(0.1)
    assert lr_factor(25, 2, "cosine", 10, 0.1) == pytest.approx(0.1)  # past the decay: the floor


def test_decay_steps_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--decay-steps", "900"]).decay_steps == 900
    with pytest.raises(SystemExit):
        parse_args(["--decay-steps", "0"])
    assert "--decay-steps: got 0" in capsys.readouterr().err


def test_the_entropy_bonus_lowers_the_loss_by_its_coefficient_times_the_mean_entropy() -> None:
    log_probs, mask = torch.full((2, 3), -1.0), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    advantages, entropy = torch.tensor([1.0, -1.0]), torch.full((2, 3), 2.0)
    plain = grpo_loss(log_probs, advantages, mask, "token-mean")
    # token-mean over 3 response tokens: (1 + 1 - 1) / 3 without the bonus; 0.1 * 2.0 less with it
    assert float(plain) == pytest.approx(1 / 3)
    with_bonus = grpo_loss(log_probs, advantages, mask, "token-mean", entropy=entropy, entropy_coef=0.1)
    assert float(with_bonus) == pytest.approx(1 / 3 - 0.2)
