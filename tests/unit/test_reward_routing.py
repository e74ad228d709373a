"""The reward interface, its routing by data_source, a user's reward by import path, infra
retries and the reward metrics (engines/reward/base.py, router.py, registry.py, metrics.py)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.reward.base import RewardResult, Trajectory, as_result, score_all
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.metrics import ScoredSample, reward_metrics
from rl_train.engines.reward.router import RewardRouter
from rl_train.flows.metric_merge import merge_local_updates
from rl_train.registry import UnknownNameError

PLUGIN = "rl_train_reward_plugin_under_test"
PLUGIN_SOURCE = '''
from rl_train.engines.reward.base import RewardResult

CALLS = []

def length_bonus(trajectory):
    """Sees the prompt, the extra columns and returns sub-scores."""
    CALLS.append(trajectory)
    return RewardResult(float(len(trajectory.response)), {"prompt_len": float(len(trajectory.prompt))})

def flaky(trajectory):
    CALLS.append(trajectory.response)
    if len(CALLS) < 3:
        return RewardResult.infra("grader busy")
    return 1.0

class Batched:
    def __init__(self):
        self.batches = []

    def score_batch(self, trajectories):
        self.batches.append(len(trajectories))
        return [0.5 for _ in trajectories]

NOT_CALLABLE = 3
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    importlib.invalidate_caches()
    return PLUGIN


def row(data_source: str, truth: str = "7", **extra: object) -> dict[str, object]:
    return {"prompt": "3+4=", "data_source": data_source, "ground_truth": truth, **extra}


def test_a_trajectory_is_read_only_and_carries_the_rows_extra_columns() -> None:
    trajectory = Trajectory.of_answer(row("arith/x", tests=["assert f() == 1"], meta={"k": [1]}), "7")
    assert trajectory.extra["tests"] == ("assert f() == 1",) and trajectory.extra["meta"]["k"] == (1,)
    with pytest.raises(TypeError):
        trajectory.extra["tests"] = ()  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        trajectory.response = "8"  # type: ignore[misc]
    assert set(trajectory.extra) == {"tests", "meta"}  # prompt, data_source, ground_truth are fields


def test_as_result_takes_numbers_and_refuses_the_rest() -> None:
    assert as_result(1, "r") == RewardResult(1.0) and as_result(True, "r").score == 1.0
    with pytest.raises(TypeError, match="reward 'x' returned str"):
        as_result("1", "reward 'x'")
    with pytest.raises(ValueError, match="not finite"):
        as_result(float("nan"), "r")
    with pytest.raises(ValueError, match="not finite"):
        as_result(RewardResult(1.0, {"a": float("inf")}), "r")


def test_score_all_uses_a_batch_when_the_reward_takes_one() -> None:
    class Batched:
        calls: list[int] = []

        def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
            self.calls.append(len(trajectories))
            return [RewardResult(float(len(t.response))) for t in trajectories]

    reward = Batched()
    answers = [Trajectory.of_answer(row("a"), text) for text in ("x", "yy", "zzz")]
    assert [r.score for r in score_all(reward, answers, "b")] == [1.0, 2.0, 3.0] and reward.calls == [3]

    class Short(Batched):
        def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
            return []

    with pytest.raises(ValueError, match="returned 0 results for 3"):
        score_all(Short(), answers, "b")


def test_routing_by_config_then_registry_names_then_default(plugin: str) -> None:
    config = RewardConfig(by_data_source={"mine": f"{plugin}:length_bonus", "arith/odd": "numeric"}, default="math")
    router = RewardRouter(config)
    assert router.route("arith/single_digit_sum") == "arith"  # the built-in task, by the registry's name
    assert router.route("arith/odd/x") == "numeric"  # the config's longest prefix wins over the registry's
    assert router.route("mine") == f"{plugin}:length_bonus"
    assert router.route("mine/sub") == f"{plugin}:length_bonus"
    assert router.route("gsm8k") == "math"  # nothing names it: the default
    assert router.route("code_tests/easy") == "code_tests"
    with pytest.raises(UnknownNameError, match="no reward for data_source 'gsm8k'.*reward.default"):
        RewardRouter().route("gsm8k")


def test_the_arith_task_scores_as_it_always_did() -> None:
    answers = [Trajectory.of_answer(row("arith/single_digit_sum"), text) for text in ("7", " 7 ", "8", "7.", "")]
    assert [r.score for r in RewardRouter().score(answers)] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_users_reward_by_import_path_sees_the_whole_row(plugin: str) -> None:
    router = RewardRouter(RewardConfig(by_data_source={"mine": f"{plugin}:length_bonus"}))
    (result,) = router.score([Trajectory.of_answer(row("mine", level=3), "abcd")])
    assert result == RewardResult(4.0, {"prompt_len": 4.0})
    seen = sys.modules[plugin].CALLS[0]
    assert seen.prompt == "3+4=" and seen.extra == {"level": 3} and seen.data_source == "mine"


def test_a_users_class_is_built_once_and_scores_batches(plugin: str) -> None:
    router = RewardRouter(RewardConfig(default=f"{plugin}:Batched"))
    answers = [Trajectory.of_answer(row(f"src{i}"), "x") for i in range(3)]
    assert [r.score for r in router.score(answers)] == [0.5] * 3
    router.score(answers[:1])
    assert router.reward(f"{plugin}:Batched").batches == [3, 1]  # type: ignore[union-attr]


def test_the_configured_rewards_are_built_up_front(plugin: str) -> None:
    router = RewardRouter(RewardConfig(by_data_source={"a": f"{plugin}:Batched", "b": "numeric"}))
    router.build_configured()
    assert set(router._built) == {f"{plugin}:Batched", "numeric"}
    assert router.reward("numeric").rel_tol == 1e-6  # type: ignore[union-attr]  # built from reward.numeric


def test_an_infra_result_is_retried_a_bounded_number_of_times(plugin: str) -> None:
    # flaky: infra on its first two calls, then 1.0. Two retries reach the verdict...
    router = RewardRouter(RewardConfig(default=f"{plugin}:flaky", max_infra_retries=2))
    assert router.score([Trajectory.of_answer(row("s"), "a")]) == [RewardResult(1.0)]
    assert sys.modules[plugin].CALLS == ["a", "a", "a"]
    # ...one retry does not: the sample stays infra, with the grader's reason.
    sys.modules[plugin].CALLS.clear()
    router = RewardRouter(RewardConfig(default=f"{plugin}:flaky", max_infra_retries=1))
    (result,) = router.score([Trajectory.of_answer(row("s"), "a")])
    assert result.is_infra and result.reason == "grader busy" and result.score == 0.0


def test_import_paths_are_checked_at_config_load(plugin: str) -> None:
    good = load_config(None, [f'reward.by_data_source={{"mine": "{plugin}:length_bonus"}}', "reward.default=math"])
    assert good.reward.by_data_source == {"mine": f"{plugin}:length_bonus"} and good.reward.default == "math"
    cases = {
        "no_such_pkg_xyz:f": r"module 'no_such_pkg_xyz' cannot be imported \(ModuleNotFoundError",
        f"{plugin}:missing": rf"module '{plugin}' has no attribute 'missing'",
        f"{plugin}:NOT_CALLABLE": r"'NOT_CALLABLE' is a int, not callable",
        f"{plugin}:": r"an import path is .package.module:attr., both parts non-empty",
        "exakt": r"unknown reward; allowed: a registered reward \(arith, code_tests, exact, is_number, math, numeric\) or "
        r"'package.module:function_or_Class'",
    }
    for value, message in cases.items():
        with pytest.raises(ConfigError, match=rf"reward.by_data_source: 'mine': got '{value}': {message}"):
            load_config(None, [f'reward.by_data_source={{"mine": "{value}"}}'])
    with pytest.raises(ConfigError, match=r"reward.default: got 'exakt': unknown reward"):
        load_config(None, ["reward.default=exakt"])


def test_a_run_that_routes_to_code_tests_runs_untrusted_code() -> None:
    plain = load_config(None, [])
    assert plain.untrusted_code({"single_turn"}) == []
    assert plain.untrusted_code({"single_turn"}, {"arith", "code_tests"}) == [
        "the code_tests reward (the policy's code run against unit tests)"
    ]
    routed = load_config(None, ['reward.by_data_source={"py": "code_tests"}'])
    assert len(routed.untrusted_code({"single_turn"})) == 1


def test_reward_metrics_leave_infra_out_count_it_and_average_sub_scores_per_source() -> None:
    samples = [
        ScoredSample("code/a", RewardResult(1.0, {"tests_passed": 2.0})),
        ScoredSample("code/a", RewardResult(0.5, {"tests_passed": 1.0})),
        ScoredSample("code/a", RewardResult.infra("sandbox did not start")),
        ScoredSample("arith", RewardResult(0.0)),
        ScoredSample("arith", RewardResult.infra("x")),
    ]
    metrics = reward_metrics(samples)
    assert metrics == {
        "reward/mean": 1.5 / 3,  # the three samples with a verdict
        "reward/max": 1.0,
        "reward/infra_failures": 2.0,
        "reward/infra_failures/code/a": 1.0,
        "reward/infra_failures/arith": 1.0,
        "reward/code/a/tests_passed": 1.5,
    }
    # A step of two local updates: the infra counts add up, the means average.
    merged = merge_local_updates([metrics, reward_metrics(samples[:2])])
    assert merged["reward/infra_failures"] == 2.0 and merged["reward/infra_failures/arith"] == 1.0
    assert merged["reward/mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert reward_metrics([]) == {"reward/mean": 0.0, "reward/max": 0.0, "reward/infra_failures": 0.0}
