"""A training run on one GPU (``gpu``-marked; ``scripts/gpu_check.sh`` runs it): the torch
engines on CUDA, a training rank and a rollout replica sharing the GPU through one placement
group bundle (half a GPU each, R-2.6's colocated case); the run trains and syncs weights."""

from __future__ import annotations

from typing import Any

import pytest
from sync_run import fit_sync_run

from rl_train.storage.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def test_a_sync_run_on_one_gpu_shared_by_the_trainer_and_the_rollout(
    small_run_config: dict[str, Any], ray_local
) -> None:
    trainer = fit_sync_run(small_run_config, 2, actor={"device": "cuda"}, rollout={"device": "cuda"})
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/loss" in m for m in metrics)


def test_reward_workers_colocated_on_the_rollouts_gpu_stream_scores(small_run_config: dict[str, Any], ray_local) -> None:
    """``reward.device: cuda``, ``reward.placement: colocate``: the reward worker takes a share of
    the bundle the rollout replica and the training rank share (it sees the GPU, or its start
    fails in ``check_device``), and scores each group as it finishes."""
    trainer = fit_sync_run(
        small_run_config,
        2,
        actor={"device": "cuda"},
        rollout={"device": "cuda"},
        reward={"device": "cuda", "placement": "colocate", "streaming": True},
    )
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["reward/streamed"] == 1.0 for m in metrics)
