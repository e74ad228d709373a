"""A late grader does not stall rollout (issue: the reward box, "Done when"): separate_async's
rollout tokens per second with a judge that sleeps a second a batch stay near the same run's
with the fast rule reward. The same runs as ``python -m rl_train.bench.late_grader`` (the ratio
recorded in ``bench/RESULTS.md``); the check here is generous, for a loaded machine: the figure
itself comes from the bench."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench import late_grader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_sleeping_grader_leaves_rollout_tokens_per_second_near_the_fast_rules(
    tiny_model_dir: Path, tmp_path: Path, ray_local
) -> None:
    results = late_grader.compare(5, late_grader.DEFAULT_GRADER_SECONDS, False, tmp_path, tiny_model_dir)
    late_grader.report(results, 5, late_grader.DEFAULT_GRADER_SECONDS)
    slow, fast = results["slow grader"], results["fast rule"]
    assert slow["streamed"] == 1.0  # every sample scored in the background, before its batch
    assert slow["ratio"] > 0.75, results  # the bench's run gives the figure (about 1: see RESULTS.md)
    assert fast["tokens_per_second"] > 0
