"""What both async modes do around the step: background rollout that pauses for validation.

Validation generates on the same replicas with a blocking call, so background generation
holds while it runs. Each step reports the replay buffer's staleness/eviction figures and
the version each replica serves (R-7.6, R-8.5); a failure inside a replica's background
generation fails the step instead of silently starving it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray

from rl_train.flows.base import BaseTrainer
from rl_train.storage.replay_buffer_async import ReplayBufferAsync


class RolloutGenerationError(RuntimeError):
    """A rollout replica's background generation raised."""


class AsyncTrainerHooks(BaseTrainer):
    """Shared hooks of the async modes; the subclasses decide what rollout does around a step."""

    replay_buffer_class: type = ReplayBufferAsync

    def on_train_begin(self) -> None:
        """Warm-up: dispatch the first global batches before training starts.

        Counted in global batches (train_batch_size groups, times 1 + prefetch_batches): a
        long tool-call tail needs about a global step's worth of groups in flight, or the
        trainer of separate_async waits on the slowest few groups of every local update.
        """
        self.replay_buffer.dispatch(self.config.trainer.train_batch_size, step=1)

    def on_train_end(self) -> None:
        """Stop background generation; a replica already gone must not keep teardown from running."""
        if self.context is None:
            return
        with contextlib.suppress(ray.exceptions.RayError):
            self.rollout_call("pause_generation")

    def on_validate_begin(self, step: int) -> None:
        self.rollout_call("pause_generation")

    def on_validate_end(self, step: int, metrics: dict[str, float]) -> None:
        self.rollout_call("resume_generation")

    @property
    def replay_buffer(self) -> Any:
        assert self.context is not None, "init() first"
        return self.context.replay_buffer

    def step_metrics(self) -> dict[str, float]:
        """Replay figures of the step, the version each replica serves; raises on rollout errors."""
        errors = [e for replica_errors in self.rollout_call("generation_errors") for e in replica_errors]
        if errors:
            raise RolloutGenerationError(f"background generation failed: {errors[0]}")
        metrics = dict(self.replay_buffer.pop_metrics())
        for i, version in enumerate(self.rollout_call("version")):
            metrics[f"rollout/version/{i}"] = float(version)
        return metrics
