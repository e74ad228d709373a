"""The built-in tool task (``configs/tool-tiny.yaml``: three-digit sums answered through the
calculator by the multi-turn tool agent loop) learns, in sync and in separate_async.

The policy is the config's own (2,500 steps of format pretraining on the tool loop's layout,
about 10 minutes on two cores, made once per session); each mode then trains 30 global steps
with its phases called directly. Measured when the test was written (one run each): sync
0.44 -> 0.85 and separate_async 0.44 -> 0.98 mean training reward. The assertions leave room
for seed-to-seed spread: the last 5 steps' mean is at least 0.2 above the first 5 steps'.
Select with ``-m slow``.
"""

from __future__ import annotations

import os
from pathlib import Path
from statistics import mean

import pytest

from rl_train.config import load_config
from rl_train.flows.base import prepare_inputs
from rl_train.flows.train import run_training
from rl_train.storage.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tool-tiny.yaml"
MODES = {
    "sync": [],
    # one mini-batch per local update: 4 local updates of 32 groups per global step
    "separate_async": [
        "trainer.mode=separate_async",
        "trainer.train_batch_size=128",
        "actor.ppo_mini_batch_size=32",
        "rollout.num_threads=1",
        "actor.num_threads=1",
    ],
}


@pytest.fixture(scope="module")
def tool_inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The config's policy and data, made once (a copy already under the repo is reused)."""
    root = tmp_path_factory.mktemp("tool-task")
    config = load_config(CONFIG)
    model = Path(config.model.path) if Path(config.model.path).is_absolute() else REPO / config.model.path
    overrides = [f"data.data_dir={root / 'data'}", f"run.output_dir={root / 'runs'}"]
    overrides.append(f"model.path={model if model.exists() else root / 'model'}")
    prepare_inputs(load_config(CONFIG, overrides))
    return overrides


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_tool_task_learns(mode: str, tool_inputs: list[str]) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    config = load_config(
        CONFIG,
        [
            *tool_inputs,
            *MODES[mode],
            f"run.name=tool-learns-{mode}",
            "trainer.total_steps=30",
            "trainer.use_prefect=false",
            "trainer.val_every_steps=0",
            "trainer.val_before_train=false",
            "checkpoint.every_steps=0",
        ],
    )
    result = run_training(config)
    rewards = [row["reward/mean"] for row in read_metrics(result["run_dir"])]
    assert len(rewards) == 30
    first, last = mean(rewards[:5]), mean(rewards[-5:])
    assert last >= first + 0.2, (mode, rewards)
