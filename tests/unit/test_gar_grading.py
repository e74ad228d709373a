"""Groupwise grading's reward side (GAR, R-6.6): the group grader protocol, the built-in brevity
grader, a user's grader by import path, the ``reward.gar`` config, and grading whole groups once."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.reward.base import (
    GroupInfra,
    GroupReward,
    GroupVerdict,
    RewardResult,
    Trajectory,
    check_verdicts,
)
from rl_train.engines.reward.config import GarConfig
from rl_train.engines.reward.gar_graders import GROUP_GRADERS, Brevity, GroupGrading, build_grader
from rl_train.registry import registries

GRADER = "gar_grader_plugin"
GRADER_SOURCE = '''
from rl_train.engines.reward.base import GroupInfra, GroupVerdict

CALLS = []


def halves(trajectories, results):
    """The first half of the group is the better one; a group of one has no verdict."""
    CALLS.append(len(trajectories))
    if len(trajectories) < 2:
        return GroupInfra("nothing to compare")
    return [GroupVerdict(1.0 if i < len(trajectories) // 2 else 0.5) for i in range(len(trajectories))]


def wrong_length(trajectories, results):
    return [GroupVerdict()]


NOT_CALLABLE = 3
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{GRADER}.py").write_text(GRADER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return GRADER


def answer(text: str, truth: str = "7", group: str = "g") -> Trajectory:
    return Trajectory.of_answer({"prompt": f"{group}?", "data_source": "arith", "ground_truth": truth}, text)


PASS, FAIL = RewardResult(1.0), RewardResult(0.0)


def test_the_protocol_takes_a_function_and_checks_what_it_returns() -> None:
    def grader(trajectories, results):  # type: ignore[no-untyped-def]
        return [GroupVerdict() for _ in trajectories]

    assert isinstance(grader, GroupReward) and isinstance(Brevity(), GroupReward)
    assert check_verdicts(GroupInfra("judge timed out"), 3, "g") == GroupInfra("judge timed out")
    assert check_verdicts((GroupVerdict(0.5, True),), 1, "g") == [GroupVerdict(0.5, True)]
    with pytest.raises(ValueError, match=r"g returned 1 verdicts for a group of 2 trajectories"):
        check_verdicts([GroupVerdict()], 2, "g")
    with pytest.raises(ValueError, match=r"g returned quality 0.0 at 1; a quality lies in \(0, 1\]"):
        check_verdicts([GroupVerdict(), GroupVerdict(0.0)], 2, "g")
    with pytest.raises(ValueError, match=r"quality 1.5 at 0"):
        check_verdicts([GroupVerdict(1.5)], 1, "g")
    with pytest.raises(TypeError, match=r"returned float 0.5; a group grader returns a list of GroupVerdict"):
        check_verdicts(0.5, 1, "g")
    with pytest.raises(TypeError, match=r"returned float 1.0 at 0; expected a GroupVerdict"):
        check_verdicts([1.0], 1, "g")
    with pytest.raises(TypeError, match=r"returned str"):
        check_verdicts("ok", 2, "g")


def test_brevity_rates_passing_answers_by_length_and_flags_answer_spam() -> None:
    group = [answer("7"), answer("it is 7"), answer("8"), answer("7 7 7 7"), answer("17 27 7.5"), answer("x")]
    results = [PASS, PASS, FAIL, PASS, PASS, RewardResult.infra("sandbox down")]
    verdicts = Brevity(pass_threshold=1.0, min_quality=0.2, max_answer_repeats=3)(group, results)
    assert [v.quality for v in verdicts] == pytest.approx([1.0, 0.2, 1.0, 0.2, 0.2, 1.0])  # 1/7, 1/9 floored
    assert [v.hacking for v in verdicts] == [False, False, False, True, False, False]  # 17, 27, 7.5 are not 7
    longer = Brevity(min_quality=0.01)([answer("7"), answer("so: 7")], [PASS, PASS])
    assert [v.quality for v in longer] == pytest.approx([1.0, 1 / 5])
    # a failing spammer is no hacker (GAR only reshapes passers), and no passer: all quality 1
    assert Brevity()([answer("7 7 7"), answer("1")], [FAIL, FAIL]) == [GroupVerdict(), GroupVerdict()]
    assert Brevity(pass_threshold=0.5)([answer("7 7 7")], [RewardResult(0.6)]) == [GroupVerdict(1.0, True)]


def test_graders_by_name_and_by_import_path(plugin: str) -> None:
    assert "brevity" in GROUP_GRADERS and registries()["group grader"] is GROUP_GRADERS
    built = build_grader(GarConfig(grader="brevity", min_quality=0.5, max_answer_repeats=2))
    assert isinstance(built, Brevity) and (built.min_quality, built.max_answer_repeats) == (0.5, 2)
    users = build_grader(GarConfig(grader=f"{plugin}:halves"))
    assert users([answer("a"), answer("b")], [PASS, PASS]) == [GroupVerdict(1.0), GroupVerdict(0.5)]


def test_the_gar_section_is_checked_at_config_load(plugin: str) -> None:
    config = load_config(None, ['reward.gar={"grader": "brevity", "pass_threshold": 0.5}'])
    assert config.reward.gar == GarConfig(grader="brevity", pass_threshold=0.5)
    assert not load_config(None, []).reward.gar.on  # off unless a grader is set
    cases = {
        '{"grader": "brevty"}': r"reward.gar.grader: got 'brevty': unknown group grader; available: brevity, "
        r"or a function or class by import path 'package.module:function_or_Class'",
        f'{{"grader": "{plugin}:missing"}}': rf"reward.gar.grader: got '{plugin}:missing': module '{plugin}' has no attribute",
        f'{{"grader": "{plugin}:NOT_CALLABLE"}}': r"'NOT_CALLABLE' is a int, not callable; a group grader is a function",
        '{"grader": "no_such_pkg_xyz:g"}': r"module 'no_such_pkg_xyz' cannot be imported",
        '{"grader": "brevity", "min_quality": 0}': r"reward.gar.min_quality",
        '{"grader": "brevity", "max_answer_repeats": 1}': r"reward.gar.max_answer_repeats",
        '{"grader": "brevity", "gain": 2}': r"reward.gar.gain",
    }
    for value, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, [f"reward.gar={value}"])
    with pytest.raises(
        ConfigError,
        match=r"reward.gar: .*algorithm.adv_estimator 'gae' gives one per token; use an "
        r"outcome estimator \(gpg, grpo, grpo_passk, opo, reinforce_plus_plus_baseline, rloo\)",
    ):
        load_config(None, ['reward.gar={"grader": "brevity"}', "algorithm.adv_estimator=gae"])


def test_whole_groups_are_graded_once_and_a_failed_grader_is_recorded(plugin: str) -> None:
    import gar_grader_plugin

    gar_grader_plugin.CALLS.clear()
    grading = GroupGrading(GarConfig(grader=f"{plugin}:halves"), group_size=2)
    groups = ["g", "g", "h", "k", "k"]  # h: only one of its two trajectories is here
    trajectories = [answer(str(i), group=g) for i, g in enumerate(groups)]
    results = [PASS, FAIL, PASS, PASS, PASS]
    fields = grading.fields(groups, trajectories, results, [{} for _ in groups])
    assert fields == [
        {"gar_quality": 1.0, "gar_hacking": False, "gar_infra": ""},
        {"gar_quality": 0.5, "gar_hacking": False, "gar_infra": ""},
        {},
        {"gar_quality": 1.0, "gar_hacking": False, "gar_infra": ""},
        {"gar_quality": 0.5, "gar_hacking": False, "gar_infra": ""},
    ]
    assert gar_grader_plugin.CALLS == [2, 2]
    # scored again with the same results (the reward phase after the group filter): not graded again
    previous = [
        {"reward": r.score, "is_infra": r.is_infra, **f} for r, f in zip(results, fields, strict=True)
    ]
    again = grading.fields(groups, trajectories, results, previous)
    assert again == [{}] * 5 and gar_grader_plugin.CALLS == [2, 2]
    # a changed result is graded anew
    changed = grading.fields(groups, trajectories, [FAIL, FAIL, PASS, PASS, PASS], previous)
    assert changed[0] and changed[1] and not changed[3] and gar_grader_plugin.CALLS == [2, 2, 2]
    # a group of one: the grader fails; the whole group records why, with neutral verdicts
    single = GroupGrading(GarConfig(grader=f"{plugin}:halves"), group_size=1)
    assert single.fields(["s"], [answer("1")], [PASS], [{}]) == [
        {"gar_quality": 1.0, "gar_hacking": False, "gar_infra": "nothing to compare"}
    ]
    broken = GroupGrading(GarConfig(grader=f"{plugin}:wrong_length"), group_size=2)
    with pytest.raises(
        ValueError, match=rf"group grader '{plugin}:wrong_length' returned 1 verdicts for a group of 2"
    ):
        broken.fields(["g", "g"], trajectories[:2], results[:2], [{}, {}])
