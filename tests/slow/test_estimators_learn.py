"""The estimators with phases of their own learn the demo task to a mean reward of 0.9.

PPO + GAE (critic pool: values, critic_update) and ReMax (greedy_baseline): the same runs
as ``python -m rl_train.bench.convergence --variants gae remax --max-steps 500`` (gae: 191
steps, 8 minutes on a quiet 2-core machine; remax: 373): select with ``-m slow``. Both learn
slower than grpo on this task (``bench/convergence.py``'s variants say why), so they get a
longer run than its 250 steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rl_train.bench.convergence import REPO, run_variant

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]


@pytest.mark.parametrize("variant", ["gae", "remax"])
def test_estimator_reaches_mean_reward_0_9(variant: str, tmp_path: Path) -> None:
    args = argparse.Namespace(
        config=str(REPO / "configs" / "arith-tiny.yaml"),
        target=0.9,
        window=5,
        max_steps=500,
        overrides=[f"run.output_dir={tmp_path}", f"model.path={tmp_path / 'model'}"],
    )
    row = run_variant(variant, args)
    assert row["steps"] is not None, row
