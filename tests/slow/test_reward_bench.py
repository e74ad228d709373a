"""The reward bench's placement runs (``python -m rl_train.bench.reward``) end to end at a tiny
size: two sync runs of configs/arith-rm-tiny.yaml, the reward model in its own pool and
colocated. What it checks is that both runs trained and timed their phases; the ratio is printed
and recorded in ``bench/RESULTS.md``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench import reward as bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_both_placements_train_and_time_their_phases(tiny_model_dir: Path, tmp_path: Path, ray_local) -> None:
    policy, rm = bench.inputs(tmp_path, tiny_model_dir, 0, None, 2)
    placed = bench.placement_times(tmp_path, policy, rm, 3, 8, 4)
    bench.report(None, placed, "cpu")
    assert list(placed) == list(bench.PLACEMENTS)
    for times in placed.values():
        assert times["reward"] > 0 and times["rollout busy"] > 0 and times["step"] > 0
