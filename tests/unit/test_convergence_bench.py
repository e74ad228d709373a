"""The convergence bench's stopping rule: first step whose trailing window mean meets the target."""

from __future__ import annotations

import pytest

from rl_train.bench.convergence import steps_to_target, windowed_means


def history(rewards: list[float]) -> list[dict[str, float]]:
    return [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]


def test_window_means_start_at_the_first_full_window() -> None:
    # window 3 over 0.0, 0.3, 0.6, 0.9: steps 3 and 4 -> (0 + .3 + .6) / 3 = .3, (.3 + .6 + .9) / 3 = .6
    means = windowed_means(history([0.0, 0.3, 0.6, 0.9]), 3)
    assert [s for s, _ in means] == [3, 4]
    assert [m for _, m in means] == pytest.approx([0.3, 0.6])


def test_a_single_lucky_step_does_not_count() -> None:
    # One 1.0 among 0.8s: window-2 means are 0.8, 0.9 (step 3), ... so the target 0.9 is met at step 3,
    # while a window of 3 never reaches (max (0.8 + 1.0 + 0.8) / 3 = 0.867).
    rewards = [0.8, 0.8, 1.0, 0.8]
    assert steps_to_target(history(rewards), 0.9, 2) == 3
    assert steps_to_target(history(rewards), 0.9, 3) is None
