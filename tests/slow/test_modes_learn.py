"""Every trainer mode, and grpo on the megatron-core training engine, learns the demo task
(single-digit sums) to a mean reward of 0.9.

The same runs as ``python -m rl_train.bench.convergence --variants grpo colocate_async
separate_async megatron`` (minutes each on two cores): select with ``-m slow``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rl_train.bench.convergence import REPO, run_variant

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("variant", ["grpo", "colocate_async", "separate_async", "megatron"])
def test_mode_reaches_mean_reward_0_9(variant: str, tmp_path: Path) -> None:
    args = argparse.Namespace(
        config=str(REPO / "configs" / "arith-tiny.yaml"),
        target=0.9,
        window=5,
        max_steps=250,
        overrides=[f"run.output_dir={tmp_path}", f"model.path={tmp_path / 'model'}"],
    )
    row = run_variant(variant, args)
    assert row["steps"] is not None, row
