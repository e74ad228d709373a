"""On-policy distillation learns the demo task (``configs/distill-tiny.yaml``, R-4.10): a teacher
trained by the demo's GRPO recipe teaches a fresh built-in policy, which reaches a 10-step mean
rule reward of 0.9 within the config's steps. The teacher is trained here first (the demo's
config, its 100 steps), so the test stands alone; ``bench/distill.py`` measures the time against
GRPO from scratch. Select with ``-m slow``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_train.config import load_config
from rl_train.flows.base import prepare_inputs
from rl_train.flows.train import run_training
from rl_train.storage.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
DEMO, DISTILL = REPO / "configs" / "arith-tiny.yaml", REPO / "configs" / "distill-tiny.yaml"
TARGET, WINDOW = 0.9, 10


def test_a_fresh_policy_distilled_from_the_demos_policy_reaches_0_9(tmp_path: Path) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    common = [
        f"model.path={tmp_path / 'model'}",
        f"data.data_dir={tmp_path / 'data'}",
        f"run.output_dir={tmp_path / 'runs'}",
        "trainer.use_prefect=false",
        "trainer.val_every_steps=0",
        "checkpoint.every_steps=0",
    ]
    prepare_inputs(load_config(DEMO, common))
    teacher = Path(run_training(load_config(DEMO, common))["run_dir"]) / "policy"
    distill = load_config(DISTILL, [*common, f"teacher.path={teacher}"])
    assert distill.model.path == str(tmp_path / "model"), "the student starts from the demo's fresh policy"
    rows = read_metrics(run_training(distill)["run_dir"])
    rewards = [row["reward/mean"] for row in rows]
    means = [sum(rewards[end - WINDOW : end]) / WINDOW for end in range(WINDOW, len(rewards) + 1)]
    assert max(means) >= TARGET, rewards
    assert all(row["teacher/infra"] == 0.0 for row in rows)
