"""What both async modes do around the step: background rollout that pauses for validation.

Validation generates on the same replicas with a blocking call, so background generation
holds while it runs. Each step reports the replay buffer's staleness/eviction figures and
the version each replica serves (R-7.6, R-8.5). A failure inside a replica's background
generation does not end the run: the failed prompts are tagged ``failure``, the replay
buffer retries or refills them (``replay.refill_failed_groups``), and the step counts the
errors in ``rollout/generation_errors``, logging the first.
"""

from __future__ import annotations

import logging

from rl_train.flows.base import BaseTrainer
from rl_train.storage.replay_buffer_async import ReplayBufferAsync

logger = logging.getLogger(__name__)


class AsyncTrainerHooks(BaseTrainer):
    """Shared hooks of the async modes; the subclasses decide what rollout does around a step."""

    replay_buffer_class = ReplayBufferAsync

    def on_train_begin(self) -> None:
        """Warm-up: dispatch the first batches (one local update's groups each) before training.

        ``replay.prefetch_batches`` sets how many batches stay in flight beyond the one being
        sampled. More covers a longer tool-call tail but trains on older data: groups are
        sampled oldest first, so a queue k batches deep trains on groups about k local updates
        old. (A queue of two global batches kept separate_async's demo run two versions behind
        and it stopped learning.)
        """
        if self.start_step:  # resumed: the checkpoint's groups in flight are the warm-up
            return
        cfg = self.config.trainer
        self.replay_buffer.dispatch(cfg.train_batch_size // cfg.parameter_sync_step, step=1)

    def on_train_end(self) -> None:
        """Stop background generation, tool waits included; a replica already gone must not keep
        teardown from running."""
        self.pools.rollout.stop_generation(missing_ok=True)

    def on_validate_begin(self, step: int) -> None:
        self.pools.rollout.pause_generation()

    def on_validate_end(self, step: int, metrics: dict[str, float]) -> None:
        self.pools.rollout.resume_generation()

    def step_metrics(self) -> dict[str, float]:
        """Replay figures of the step, rollout errors, and the version each replica serves."""
        errors = self.pools.rollout.pop_generation_errors()
        if errors:
            logger.warning(
                "step: %d rollout error(s); the failed prompts are retried or refilled. First: %s",
                len(errors),
                errors[0],
            )
        metrics = dict(self.replay_buffer.pop_metrics())
        metrics["rollout/generation_errors"] = float(len(errors))
        for i, version in enumerate(self.pools.rollout.versions()):
            metrics[f"rollout/version/{i}"] = float(version)
        return metrics
