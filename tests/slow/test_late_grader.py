"""The late-grader bench (``python -m rl_train.bench.late_grader``) end to end: separate_async with a
judge that sleeps a second a batch against the fast rule reward. What it checks is the mechanism
(every sample scored in the background before its batch was sampled, groups left waiting for
their scores while rollout went on); the rollout tokens-per-second ratio is printed and recorded
in ``bench/RESULTS.md`` (over 30 steps: a timed figure is the bench's to report, not a test's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench import late_grader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_sleeping_grader_is_streamed_while_rollout_goes_on(tiny_model_dir: Path, tmp_path: Path, ray_local) -> None:
    results = late_grader.compare(5, late_grader.DEFAULT_GRADER_SECONDS, False, tmp_path, tiny_model_dir)
    late_grader.report(results, 5, late_grader.DEFAULT_GRADER_SECONDS)
    slow, fast = results["slow grader"], results["fast rule"]
    assert slow["streamed"] == 1.0 and fast["streamed"] == 1.0  # read back by the reward phase, never scored there
    assert slow["awaiting_scores"] > 0  # finished groups waited for the judge while rollout went on
    assert 0.0 < slow["ratio"] <= 1.5 and fast["tokens_per_second"] > 0
