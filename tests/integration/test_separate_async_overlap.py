"""separate_async's push runs beside the next step (R-2.6), and carries the weights it was launched with.

The trainer rank here starts every transfer 1.5 s late (a slow link) and notes wall-clock
times; a rollout replica notes a digest of the weights it serves after each push. If the
push held the trainer actor, step k + 1's first update would start only after push k
returned. Because it does not, the update runs while the push is still out, and by the time
the bytes go, the live weights have moved on: what arrives must be the copy frozen at step
k's end, not the live weights.
"""

from __future__ import annotations

import copy
import hashlib
import sys
import time
from collections.abc import Iterable
from typing import Any

import pytest
import ray
import torch

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.engines.workers.trainer_worker import TrainerWorker
from rl_train.flows.separate_async import SeparateAsyncTrainer

pytestmark = pytest.mark.integration

SLOW_LINK_SECONDS = 1.5
"""Longer than a whole step of this tiny run (about 0.3 s), so the next step meets the push."""
PARAMETER_SYNC_STEP = 2
TOTAL_STEPS = 3


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over every tensor's name and raw bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class TimedTrainerWorker(TrainerWorker):
    """Notes when each update starts, what each push froze, and when each push returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.update_starts: list[float] = []
        self.frozen: dict[int, str] = {}
        self.pushes: dict[int, dict[str, Any]] = {}

    def update(self, partition: str, keys: list[str], num_mini_batches: int) -> dict[str, float]:
        self.update_starts.append(time.time())
        return super().update(partition, keys, num_mini_batches)

    def freeze_weights(self, version: int) -> None:
        super().freeze_weights(version)
        self.frozen[version] = weights_digest(self.engine.export_weights())

    def send_weights(self, version: int, frozen: bool = False) -> tuple[Any, dict[str, float]]:
        started = time.time()
        time.sleep(SLOW_LINK_SECONDS)  # the next step trains meanwhile; what goes out must not change
        result = super().send_weights(version, frozen)
        self.pushes[version] = {
            "start": started,
            "end": time.time(),
            "live_at_end": weights_digest(self.engine.export_weights()),
        }
        return result

    def timeline(self) -> dict[str, Any]:
        return {"update_starts": self.update_starts, "frozen": self.frozen, "pushes": self.pushes}


class DigestRolloutWorker(RolloutWorker):
    """Notes a digest of the weights served after each push, by version."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: dict[int, str] = {}

    def receive_weights(self, payload: Any, version: int, timeout_seconds: float) -> dict[str, float]:
        metrics = super().receive_weights(payload, version, timeout_seconds)
        self.received[version] = weights_digest(self.engine.export_weights())
        return metrics

    def received_digests(self) -> dict[int, str]:
        return dict(self.received)


class RecordingTrainer(SeparateAsyncTrainer):
    worker_classes = WorkerClasses(trainer=TimedTrainerWorker, rollout=DigestRolloutWorker)

    def on_train_end(self) -> None:
        super().on_train_end()  # awaits the last push
        self.timeline = ray.get(self.pools.trainer.rank0.timeline.remote())
        self.received = ray.get(self.pools.rollout.actors[0].received_digests.remote())


def _config(small_run_config: dict[str, Any]) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(
        mode="separate_async",
        total_steps=TOTAL_STEPS,
        train_batch_size=2 * PARAMETER_SYNC_STEP,
        parameter_sync_step=PARAMETER_SYNC_STEP,
        use_prefect=False,
        val_every_steps=0,
    )
    cfg["rollout"].update(n=2, max_new_tokens=4)
    cfg["rollout"]["weight_sync"] = {"backend": "bucketed", "transport": "shm", "bucket_size_bytes": 1 << 16}
    # Decoupled weight decay moves every weight at every update, whatever the rewards: a push
    # that sent live weights instead of the frozen copy cannot go unnoticed.
    cfg["actor"]["weight_decay"] = 0.1
    apply_mode_defaults(cfg)
    return Config.model_validate(cfg)


def test_next_step_updates_while_the_push_is_out_and_the_push_carries_the_frozen_weights(
    small_run_config: dict[str, Any], ray_local
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    trainer = RecordingTrainer(_config(small_run_config))
    history = trainer.fit()
    assert [m["step"] for m in history] == list(range(1, TOTAL_STEPS + 1))
    update_starts = trainer.timeline["update_starts"]
    pushes, frozen = trainer.timeline["pushes"], trainer.timeline["frozen"]
    assert len(update_starts) == TOTAL_STEPS * PARAMETER_SYNC_STEP
    versions = list(range(1, TOTAL_STEPS + 1))
    assert sorted(pushes) == sorted(frozen) == versions, trainer.timeline
    assert sorted(trainer.received) == versions, trainer.received
    # Push k returned after step k + 1's first update had started, and by then that update
    # had changed the live weights: the two ran at the same time.
    overlapped = [
        k
        for k in range(1, TOTAL_STEPS)
        if update_starts[k * PARAMETER_SYNC_STEP] < pushes[k]["end"] and pushes[k]["live_at_end"] != frozen[k]
    ]
    assert overlapped, {"update_starts": update_starts, "pushes": pushes}
    # Yet every replica got exactly the weights of step k's end, frozen before the next update.
    for version in pushes:
        assert trainer.received[version] == frozen[version], version
    assert len(set(frozen.values())) == TOTAL_STEPS  # each version's weights are new
