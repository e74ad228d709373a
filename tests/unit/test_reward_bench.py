"""The reward bench's pieces at a tiny size (``python -m rl_train.bench.reward``): the same answers
scored by the rule, a reward model trained for two steps and the policy as a judge, through the
router; the placement runs' config and the tables. The placement runs themselves start Ray and
train: tests/slow/test_reward_bench.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench import reward as bench
from rl_train.config import load_config
from rl_train.engines.reward.router import RewardRouter


def test_answers_are_right_and_off_by_one_alternately() -> None:
    trajectories = bench.answers(6)
    assert {t.data_source for t in trajectories} == {"arith/single_digit_sum"}  # routed by its "arith" prefix
    scores = [r.score for r in RewardRouter().score(trajectories)]
    assert scores == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert int(trajectories[1].response) == int(trajectories[1].ground_truth) + 1


def test_the_three_kinds_score_the_same_answers(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, rm = bench.inputs(tmp_path, tiny_model_dir, 0, None, 2)
    assert rm == tmp_path / "rm" and (rm / "config.json").is_file()
    scored = bench.throughputs(policy, rm, 8, 4)
    assert [t.kind for t in scored] == ["rule", "reward model", "judge"]
    assert all(t.trajectories == 8 and t.seconds > 0 and t.per_second > 0 for t in scored)
    assert scored[0].infra == 0 and scored[1].infra == 0  # only a judge's verdict can fail to parse
    bench.report(scored, None, "cpu")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("scoring throughput, 8 trajectories")
    assert [line.split()[0] for line in lines[2:]] == ["rule", "reward", "judge"]
    assert lines[2].split()[2] == "1.0000"  # the rule against itself


def test_the_placement_runs_differ_only_in_placement(tmp_path: Path) -> None:
    configs = {
        placement: load_config(
            bench.RM_CONFIG,
            bench.placement_overrides(tmp_path, tmp_path / "p", tmp_path / "rm", placement, 3, 8, 4, "cpu"),
        )
        for placement in bench.PLACEMENTS
    }
    own, colocated = configs["own_pool"], configs["colocate"]
    assert own.reward.placement == "own_pool" and colocated.reward.placement == "colocate"
    assert own.reward.models["tiny_rm"].path == str(tmp_path / "rm")
    assert (own.trainer.total_steps, own.trainer.train_batch_size, own.rollout.n) == (3, 8, 4)
    assert (
        not own.trainer.use_prefect and own.trainer.val_every_steps == 0 and own.checkpoint.every_steps == 0
    )
    assert own.reward.by_data_source == colocated.reward.by_data_source == {"arith": "tiny_rm"}
    assert own.model_dump(exclude={"reward", "run"}) == colocated.model_dump(exclude={"reward", "run"})


def test_the_placement_table_gives_colocate_over_own_pool(capsys: pytest.CaptureFixture[str]) -> None:
    own = {"generate": 0.5, "rollout busy": 2.0, "reward": 0.25, "step": 4.0}
    colocated = {"generate": 0.5, "rollout busy": 2.0, "reward": 0.5, "step": 5.0}
    bench.report(None, {"own_pool": own, "colocate": colocated}, "cpu")
    lines = capsys.readouterr().out.strip().splitlines()
    assert "sleep and wake" in lines[0]
    assert lines[2].split() == ["generate", "0.500", "0.500", "1.000"]
    assert lines[-2].split() == ["reward", "0.250", "0.500", "2.000"]
    assert lines[-1].split() == ["step", "4.000", "5.000", "1.250"]
