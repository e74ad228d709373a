"""A training run on one GPU (``gpu``-marked; ``scripts/gpu_check.sh`` runs it): the torch
engines on CUDA, a training rank and a rollout replica sharing the GPU through one placement
group bundle (half a GPU each, R-2.6's colocated case); the run trains and syncs weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rl_train.config import Config, apply_mode_defaults
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def test_a_sync_run_on_one_gpu_shared_by_the_trainer_and_the_rollout(
    small_run_config: dict[str, Any], ray_local
) -> None:
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode="sync", use_prefect=False, val_every_steps=0, total_steps=2)
    data["actor"].update(device="cuda")
    data["rollout"].update(device="cuda")
    apply_mode_defaults(data)
    trainer = get_trainer_class("sync")(Config.model_validate(data))
    trainer.fit()
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/loss" in m for m in metrics)
