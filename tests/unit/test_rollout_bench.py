"""The rollout bench measures what it says: on a tiny case both sides generate exactly the
requested tokens per prompt, each with a log-prob, and the table reports both rates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rl_train.bench.rollout as bench
from rl_train.bench.rollout import Case, demo_prompts, format_table, load_hf, main, measure, parse_case
from rl_train.engines.model.tiny import create_tiny_policy
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in policy untrained (the bench needs no EOS: it ignores it)."""
    return create_tiny_policy(tmp_path_factory.mktemp("bench") / "tiny", seed=0, pretrain_steps=0)


def test_both_sides_generate_the_requested_tokens_with_log_probs(policy_dir: Path) -> None:
    case = Case(prompts=3, new_tokens=2)
    engine = TorchRolloutEngine(policy_dir)
    hf_out, engine_out = measure(case, engine, load_hf(policy_dir), reps=1, warmup=False)
    for out in (hf_out, engine_out):
        assert out.token_counts == [2, 2, 2]
        assert out.log_probs.shape == (3, 2)
        assert bool((out.log_probs <= 0).all()) and bool(torch.isfinite(out.log_probs).all())
    assert len(case.hf_seconds) == len(case.engine_seconds) == 1
    assert "| 3 x 2 |" in format_table([case])


def test_prompts_are_encoded_as_the_rollout_worker_encodes_them(policy_dir: Path) -> None:
    tokenizer = TorchRolloutEngine(policy_dir).tokenizer
    (prompt,) = demo_prompts(tokenizer, 1)
    assert prompt[0] == tokenizer.bos_token_id and tokenizer.decode(prompt[1:]).endswith("=")


@pytest.mark.parametrize(("text", "expected"), [("1024x4", (1024, 4)), ("256X32", (256, 32))])
def test_cases_parse(text: str, expected: tuple[int, int]) -> None:
    case = parse_case(text)
    assert (case.prompts, case.new_tokens) == expected


def test_the_table_gives_each_pair_s_ratio_median_and_range() -> None:
    case = Case(prompts=2, new_tokens=5, hf_seconds=[1.0, 2.0, 1.0], engine_seconds=[0.5, 0.5, 2.0])
    assert case.pair_ratios() == [2.0, 4.0, 0.5]
    row = format_table([case]).splitlines()[-1]
    assert row == "| 2 x 5 | 10 | 20 | 2.00x | 2.00x (0.50-4.00) |"


def test_main_says_which_heap_both_sides_ran_on(policy_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # ``--heap default`` here: ``kept`` would change this test process's allocator for good
    main(["--model", str(policy_dir), "--case", "2x2", "--reps", "1", "--threads", "1", "--heap", "default", "--gc", "default"])
    out = capsys.readouterr().out
    assert "medians of 1 interleaved runs per side; 1 torch threads; default heap; default objects" in out
    assert "| 2 x 2 |" in out


def test_frozen_objects_are_the_default_and_come_once_both_models_are_built(
    policy_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[str] = []
    real_load = bench.load_hf

    def load(path: Path) -> object:
        loaded.append("hf")
        return real_load(path)

    monkeypatch.setattr(bench, "load_hf", load)
    # the real freeze would keep this test process's objects out of its collector for good
    monkeypatch.setattr(bench, "freeze_built_objects", lambda: loaded.append("frozen") or 0)
    main(["--model", str(policy_dir), "--case", "2x2", "--reps", "1", "--threads", "1", "--heap", "default"])
    assert loaded == ["hf", "frozen"]
    assert "default heap; frozen objects" in capsys.readouterr().out
