"""Hybrid reward stacks (R-6.7, engines/reward/hybrid.py): the formula (weights, gates, clip),
infra composition, sub-score names, batches, and the names checked at config load."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.metrics import ScoredSample, reward_metrics
from rl_train.engines.reward.router import RewardRouter

PLUGIN = "rl_train_hybrid_plugin_under_test"
PLUGIN_SOURCE = '''
from rl_train.engines.reward.base import RewardResult

class Judge:
    """A batch grader that records what it was handed: 0.25 per character, sub-score 'len'."""
    batches = []

    def score_batch(self, trajectories):
        Judge.batches.append([t.response for t in trajectories])
        return [RewardResult(0.25 * len(t.response), {"len": float(len(t.response))}) for t in trajectories]

def busy_on_x(trajectory):
    """A grader whose transport fails on answers containing 'x'."""
    if "x" in trajectory.response:
        return RewardResult.infra("judge timed out")
    return 0.5

def crashed_on_x(trajectory):
    if "x" in trajectory.response:
        return RewardResult.infra("sandbox died")
    return 1.0
'''
SOURCE = "arith/single_digit_sum"


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    importlib.invalidate_caches()
    module = importlib.import_module(PLUGIN)
    module.Judge.batches.clear()
    return module


def answers(*texts: str, source: str = SOURCE) -> list[Trajectory]:
    return [Trajectory.of_answer({"prompt": "3+4=", "data_source": source, "ground_truth": "7"}, t) for t in texts]


def score(hybrid: dict[str, Any], *texts: str) -> list[RewardResult]:
    router = RewardRouter(RewardConfig.model_validate({"hybrid": hybrid, "by_data_source": {"arith": "mix"}}))
    return router.score(answers(*texts))


def test_weights_sum_the_components_and_each_is_a_sub_score() -> None:
    mix = {"mix": {"components": {"exact": "exact", "format": "is_number"}, "weights": {"exact": 0.8, "format": 0.2}}}
    results = score(mix, "7", "8", "seven", " 7 ")
    # "7": 0.8*1 + 0.2*1; "8": a number, wrong: 0.2; "seven": neither; " 7 ": blanks ignored by both
    assert [r.score for r in results] == pytest.approx([1.0, 0.2, 0.0, 1.0])
    assert [r.sub_scores for r in results] == [
        {"exact": 1.0, "format": 1.0},
        {"exact": 0.0, "format": 1.0},
        {"exact": 0.0, "format": 0.0},
        {"exact": 1.0, "format": 1.0},
    ]


def test_unlisted_components_weigh_one_and_the_sum_is_clipped() -> None:
    # exact + format: 2.0 for "7", clipped to 1.5; a weight of -1 on format: "8" scores -1, clipped to -0.5.
    clipped = {"mix": {"components": {"exact": "exact", "format": "is_number"}, "clip": [0.0, 1.5]}}
    assert [r.score for r in score(clipped, "7", "8")] == [1.5, 1.0]
    penalty = {"mix": {"components": {"exact": "exact", "format": "is_number"}, "weights": {"format": -1.0}, "clip": [-0.5, 1.0]}}
    assert [r.score for r in score(penalty, "7", "8", "x")] == [0.0, -0.5, 0.0]
    # a weight of 0 logs a component without counting it
    logged = {"mix": {"components": {"exact": "exact", "format": "is_number"}, "weights": {"format": 0.0}}}
    assert [(r.score, r.sub_scores["format"]) for r in score(logged, "8")] == [(0.0, 1.0)]


def test_a_gated_component_counts_only_past_its_gate_and_is_scored_only_there(plugin: Any) -> None:
    mix = {
        "mix": {
            "components": {"rule": "exact", "judge": f"{PLUGIN}:Judge"},
            "weights": {"judge": 0.5},
            "gates": [{"component": "judge", "requires": "rule", "at_least": 1.0}],
        }
    }
    results = score(mix, "7", "8", " 7", "77")
    assert plugin.Judge.batches == [["7", " 7"]]  # one batch, the rule's passers only
    # "7": 1 + 0.5 * 0.25; " 7": 1 + 0.5 * 0.5; gated off: the judge counts 0.0 and has no own sub-scores
    assert [r.score for r in results] == [1.125, 0.0, 1.25, 0.0]
    assert results[0].sub_scores == {"rule": 1.0, "judge": 0.25, "judge.len": 1.0}
    assert results[1].sub_scores == {"rule": 0.0, "judge": 0.0}
    # the gate's threshold: at_least 0 opens it for every answer
    mix["mix"]["gates"][0]["at_least"] = 0.0  # type: ignore[index]
    score(mix, "7", "8")
    assert plugin.Judge.batches[-1] == ["7", "8"]


def test_an_infra_component_makes_the_result_infra_with_the_reasons_joined(plugin: Any) -> None:
    mix = {"mix": {"components": {"rule": "exact", "judge": f"{PLUGIN}:busy_on_x", "tests": f"{PLUGIN}:crashed_on_x"}}}
    router = RewardRouter(RewardConfig.model_validate({"hybrid": mix, "by_data_source": {"arith": "mix"}, "max_infra_retries": 0}))
    ok, failed = router.score(answers("7", "x"))
    assert ok == RewardResult(2.5, {"rule": 1.0, "judge": 0.5, "tests": 1.0})
    assert failed.is_infra and failed.score == 0.0
    assert failed.reason == "hybrid 'mix': judge: judge timed out; tests: sandbox died"
    assert failed.sub_scores == {"rule": 0.0}  # what did score, for the record; the metrics leave it out


def test_a_gate_that_reads_an_infra_result_leaves_its_component_unscored(plugin: Any) -> None:
    mix = {
        "mix": {
            "components": {"tests": f"{PLUGIN}:crashed_on_x", "judge": f"{PLUGIN}:Judge"},
            "gates": [{"component": "judge", "requires": "tests"}],
        }
    }
    ok, failed = score(mix, "7", "x")
    assert plugin.Judge.batches == [["7"]]  # no verdict to open the gate with: the judge does not run
    assert ok.score == 1.25 and failed.is_infra and failed.reason == "hybrid 'mix': tests: sandbox died"


def test_a_hybrid_may_contain_another_and_its_sub_scores_nest() -> None:
    config = {
        "inner": {"components": {"exact": "exact", "format": "is_number"}, "weights": {"format": 0.5}},
        "mix": {"components": {"base": "inner", "math": "math"}, "weights": {"math": 0.1}},
    }
    (result,) = score(config, "7")
    assert result.score == pytest.approx(1.5 + 0.1)
    assert result.sub_scores == {"base": 1.5, "base.exact": 1.0, "base.format": 1.0, "math": 1.0, "math.answer_found": 1.0}


def test_a_reward_named_by_a_route_and_a_component_is_built_once(plugin: Any) -> None:
    config = RewardConfig.model_validate(
        {
            "hybrid": {"mix": {"components": {"rule": "exact", "judge": f"{PLUGIN}:Judge"}}},
            "by_data_source": {"arith": "mix", "judged": f"{PLUGIN}:Judge"},
        }
    )
    router = RewardRouter(config)
    router.build_configured()
    hybrid = router.reward("mix")
    assert hybrid.components["judge"] is router.reward(f"{PLUGIN}:Judge")  # type: ignore[union-attr]


def test_each_component_is_logged_per_data_source() -> None:
    mix = {"mix": {"components": {"exact": "exact", "format": "is_number"}, "weights": {"exact": 0.8, "format": 0.2}}}
    results = score(mix, "7", "8", "x", "7")
    metrics = reward_metrics([ScoredSample(SOURCE, r) for r in results])
    assert metrics[f"reward/{SOURCE}/exact"] == 0.5 and metrics[f"reward/{SOURCE}/format"] == 0.75
    assert metrics["reward/mean"] == pytest.approx((1.0 + 0.2 + 0.0 + 1.0) / 4)


def test_a_hybrid_that_holds_code_tests_runs_untrusted_code() -> None:
    config = load_config(
        None,
        [
            'reward.hybrid={"mix": {"components": {"tests": "code_tests", "format": "is_number"}}}',
            'reward.by_data_source={"py": "mix"}',
        ],
    )
    assert config.untrusted_code({"single_turn"}) == ["the code_tests reward (the policy's code run against unit tests)"]
    plain = load_config(None, ['reward.hybrid={"mix": {"components": {"format": "is_number"}}}'])
    assert plain.untrusted_code({"single_turn"}, {"mix"}) == []
    routed_by_data = load_config(None, ['reward.hybrid={"mix": {"components": {"tests": "code_tests"}}}'])
    assert len(routed_by_data.untrusted_code({"single_turn"}, {"mix"})) == 1  # a row's data_source routes to it


@pytest.mark.parametrize(
    ("hybrid", "message"),
    [
        (
            {"a": {"components": {"x": "b"}}, "b": {"components": {"y": "a"}}},
            r"reward.hybrid.b.components.y: 'a' contains itself \(a -> b -> a\)",
        ),
        ({"a": {"components": {"x": "exact", "me": "a"}}}, r"reward.hybrid.a.components.me: 'a' contains itself \(a -> a\)"),
        (
            {"a": {"components": {"x": "exakt"}}},
            r"reward.hybrid.a.components.x: got 'exakt': unknown reward; allowed: a registered reward .*"
            r"or one this config defines \(a\)",
        ),
        ({"a": {"components": {"x": "no_such_pkg_xyz:f"}}}, r"reward.hybrid.a.components.x: got 'no_such_pkg_xyz:f'"),
        ({"a": {"components": {"x": "exact"}, "weights": {"y": 1.0}}}, r"reward.hybrid.a: weights.y: not a component"),
        (
            {"a": {"components": {"x": "exact"}, "gates": [{"component": "x", "requires": "z"}]}},
            r"reward.hybrid.a: gates.0.requires: got 'z': not a component; the components are: x",
        ),
        (
            {"a": {"components": {"x": "exact"}, "gates": [{"component": "x", "requires": "x"}]}},
            r"reward.hybrid.a: gates.0: component 'x' cannot gate itself",
        ),
        (
            {
                "a": {
                    "components": {"x": "exact", "y": "exact", "z": "exact"},
                    "gates": [{"component": "y", "requires": "x"}, {"component": "z", "requires": "y"}],
                }
            },
            r"reward.hybrid.a: gates.1.requires: got 'y', which is gated itself",
        ),
        ({"a": {"components": {"x": "exact"}, "clip": [1.0, 0.0]}}, r"reward.hybrid.a: clip: got \[1.0, 0.0\]: low must not exceed high"),
        ({"a": {"components": {}}}, r"reward.hybrid.a.components: got \{\}"),
        ({"a": {"components": {"x.y": "exact"}}}, r"reward.hybrid.a: components: got the name 'x.y'; a component's name is"),
        ({"a": {"components": {"x": "exact"}, "weights": {"x": float("nan")}}}, r"reward.hybrid.a.weights.x: got 'NaN': Input should be a finite number"),
        ({"exact": {"components": {"x": "math"}}}, r"reward.hybrid.exact: a defined reward's name may not .* be a registered"),
    ],
)
def test_bad_stacks_fail_at_config_load_with_the_dotted_path(hybrid: dict[str, Any], message: str) -> None:
    import json

    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"reward.hybrid={json.dumps(hybrid)}"])


def test_a_route_may_name_a_hybrid_and_a_typo_lists_the_defined_ones() -> None:
    hybrid = '{"mix": {"components": {"x": "exact"}}}'
    assert load_config(None, [f"reward.hybrid={hybrid}", 'reward.by_data_source={"arith": "mix"}']).reward.by_data_source
    with pytest.raises(ConfigError, match=r"reward.by_data_source: 'arith': got 'mixx': unknown reward.*\(mix\)"):
        load_config(None, [f"reward.hybrid={hybrid}", 'reward.by_data_source={"arith": "mixx"}'])
