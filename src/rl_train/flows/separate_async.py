"""``separate_async`` (R-2.6 - R-2.8): a standalone rollout pool that never stops generating.

The rollout replicas keep writing to the TransferQueue while the trainer runs
``parameter_sync_step`` local updates per global step; at step end the new weights are
pushed without waiting (the previous push is awaited first, so at most one is in flight).
The push runs in the trainer actors' weight-sync thread from a frozen copy of the weights,
so the next step's first update starts while it is still on the wire; partial rollouts
continue under the new weights when they land. pi_old stays the weights of local update 0
through a CPU snapshot on each rank. When the queue cannot supply a batch within
``replay.rescue_after_seconds``, rank 0's spare engine generates fresh groups in place.
Its config defaults and refusals are in ``rl_train.modes``.
"""

from __future__ import annotations

from rl_train import tasks
from rl_train.flows.async_hooks import AsyncTrainerHooks
from rl_train.flows.step import PhaseRunner


class SeparateAsyncTrainer(AsyncTrainerHooks):
    def on_train_begin(self) -> None:
        super().on_train_begin()
        self.replay_buffer.rescue = self._rescue

    def on_sample_begin(self, step: int, local_update: int) -> None:
        if local_update == 0 and self.config.trainer.parameter_sync_step > 1:
            self.pools.trainer.snapshot_pi_old()

    def on_sample_end(self, step: int, local_update: int) -> None:
        return None  # the standalone pool never sleeps

    def on_step_end(self, step: int, run: PhaseRunner) -> dict[str, float]:
        self.pools.trainer.clear_pi_old()
        ctx = self.context
        ctx.pending_push, metrics = run(tasks.push_weights, self.run_id, step, ctx.pending_push)
        ctx.version = step
        return {**metrics, **self.step_metrics()}

    def on_train_end(self) -> None:
        try:
            pending, self.context.pending_push = self.context.pending_push, None
            if pending is not None:
                pending.wait()
        finally:
            super().on_train_end()

    def _rescue(self, keys: list[str]) -> None:
        buffer = self.replay_buffer
        self.pools.trainer.rescue_generate(keys, buffer.n, buffer.sampling, self.context.version)
