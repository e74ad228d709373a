"""The time-to-reward bench's ratio per seed, where one side or both never reach the target."""

from __future__ import annotations

from rl_train.bench.time_to_reward import Curve, format_report, seed_ratio


def curve(side: str, rewards: list[float], total: float, step_seconds: float = 1.0) -> Curve:
    c = Curve(side, 0, 1, rewards=rewards, seconds=[step_seconds * (i + 1) for i in range(len(rewards))])
    c.total_seconds = total
    return c


REACHES = [1.0] * 10  # a 10-step mean of 1.0 at step 10
NEVER = [0.5] * 20


def test_both_reach_gives_the_ratio_of_their_times() -> None:
    assert seed_ratio(curve("baseline", REACHES, 30.0, 2.0), curve("rl-train", REACHES, 30.0)) == ("=", 0.5)


def test_only_rl_train_reaching_is_bounded_by_the_baselines_whole_run() -> None:
    relation, ratio = seed_ratio(curve("baseline", NEVER, 40.0), curve("rl-train", REACHES, 30.0))
    assert (relation, ratio) == ("<", 10.0 / 40.0)


def test_only_the_baseline_reaching_is_bounded_from_below() -> None:
    relation, ratio = seed_ratio(curve("baseline", REACHES, 30.0), curve("rl-train", NEVER, 40.0))
    assert (relation, ratio) == (">", 40.0 / 10.0)


def test_neither_reaching_has_no_ratio() -> None:
    assert seed_ratio(curve("baseline", NEVER, 40.0), curve("rl-train", NEVER, 40.0)) == ("-", None)


def test_report_names_the_bound_and_the_worst_seed() -> None:
    pairs = [
        (curve("baseline", REACHES, 30.0, 2.0), curve("rl-train", REACHES, 30.0)),  # 0.50
        (curve("baseline", NEVER, 40.0), curve("rl-train", REACHES, 30.0, 3.0)),  # < 0.75
    ]
    lines = format_report(pairs).splitlines()
    assert "rl-train / baseline time to 0.9 = 0.50" in lines[-3]
    assert lines[-2].endswith("= < 0.75 (the baseline never reached 0.9: rl-train's time over the baseline's whole run)")
    assert lines[-1].startswith("at most 0.75 on every seed")
    both = format_report([pairs[0], pairs[0]]).splitlines()[-1]
    assert both == "median ratio over 2 seeds: 0.50; worst 0.50"
    behind = format_report([(curve("baseline", REACHES, 30.0), curve("rl-train", NEVER, 40.0))]).splitlines()
    assert behind[-2].endswith("= > 4.00 (rl-train never reached 0.9: its whole run over the baseline's time)")
    assert behind[-1].startswith("rl-train did not reach")
