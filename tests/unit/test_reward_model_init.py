"""``rl-train init-reward-model`` (engines/reward/tiny_rm.py, tiny_rm_data.py): it never
overwrites a directory, it is deterministic by seed, and the model it trains tells right
answers from wrong ones it has never seen, and ranks a prompt's near misses below its right
answer nearly always (it learns the table, not only what answers look like)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.cli import main
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.model_config import RewardModelConfig
from rl_train.engines.reward.reward_model import RewardModel
from rl_train.engines.reward.tiny_rm import train_tiny_rm
from rl_train.engines.reward.tiny_rm_data import draw_examples


def test_it_refuses_a_directory_that_holds_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["init-reward-model", "--out", str(out), "--steps", "1"]) == 2
    assert "exists and is not empty; init-reward-model never overwrites" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    assert (
        main(["init-reward-model", "--out", str(tmp_path / "rm"), "--task", "tool_sum", "--steps", "1"]) == 2
    )
    assert "learns one of single_digit_sum, multi_digit_sum" in capsys.readouterr().err


def test_the_examples_are_deterministic_and_the_held_out_wrong_answers_unseen() -> None:
    train = draw_examples("single_digit_sum", 0, 2000)
    assert train == draw_examples("single_digit_sum", 0, 2000) and train != draw_examples(
        "single_digit_sum", 1, 2000
    )
    seen = {(e.prompt, e.response) for e in train}
    held = draw_examples("single_digit_sum", 0, 500, unseen=seen)
    assert all((e.prompt, e.response) not in seen for e in held if e.label == 0)
    for example in train + held:  # labels agree with the exact-match rule
        a, b = example.prompt.rstrip("=").split("+")
        assert example.label == int(example.response == str(int(a) + int(b)))
    assert 0.4 < sum(e.label for e in train) / len(train) < 0.6


def test_the_trained_model_tells_right_answers_from_wrong_ones(tmp_path: Path) -> None:
    report = train_tiny_rm(tmp_path / "rm", seed=0, progress=lambda _: None)
    assert report.held_out_accuracy > 0.95
    assert report.near_miss_ranking > 0.95  # chance: 0.5; the RL run on it alone needs ~0.9
    rm = RewardModel("reward.models.rm", RewardModelConfig(path=str(report.out), normalise="sigmoid"))
    row = {"prompt": "3+4=", "data_source": "arith/single_digit_sum", "ground_truth": "7"}
    right, *wrong = rm.score_batch([Trajectory.of_answer(row, text) for text in ("7", "", "x+", "93", "6", "8")])
    assert right.score > 0.5 and all(w.score < 0.5 for w in wrong)
    tokenizer = rm.encoder.tokenizer  # its own vocabulary and template, not the policy's
    assert tokenizer.bos_token == "<|bos|>" and "<|assistant|>" in tokenizer.get_vocab()
    # scored through the worker's path (the saved tokenizer read back), on a fresh draw whose wrong
    # answers include near misses (about a quarter of the examples)
    held = draw_examples("single_digit_sum", 0, 300, unseen=set())
    logits = [
        r.sub_scores["rm_logit"]
        for r in rm.score_batch([Trajectory.of_answer({**row, "prompt": e.prompt}, e.response) for e in held])
    ]
    assert sum((v > 0) == bool(e.label) for v, e in zip(logits, held, strict=True)) / len(held) > 0.95


def test_it_is_deterministic_by_seed(tmp_path: Path) -> None:
    runs = [
        train_tiny_rm(tmp_path / name, seed=seed, steps=5, progress=lambda _: None)
        for name, seed in (("a", 0), ("b", 0), ("c", 1))
    ]
    weights = [(r.out / "model.safetensors").read_bytes() for r in runs]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    assert (runs[0].out / "tokenizer.json").read_bytes() == (runs[1].out / "tokenizer.json").read_bytes()
