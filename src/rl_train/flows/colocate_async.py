"""``colocate_async`` (R-2.5): rollout and training share devices, and overlap at step edges.

Warm-up batches are dispatched before the first step. Once a batch is sampled, in-flight
requests are aborted (their tokens kept as partial rollouts) and rollout sleeps while the
trainer works. At step end the new weights are pushed, rollout wakes and generation resumes:
the partial rollouts continue under the new weights, so their tokens span versions
[k-1, k] and staleness stays within 1, while the long tail of step k overlaps step k+1.
Its config defaults (token-level IS, staleness threshold 2) are in ``rl_train.modes``.
"""

from __future__ import annotations

from rl_train import tasks
from rl_train.flows.async_hooks import AsyncTrainerHooks
from rl_train.flows.step import PhaseRunner


class ColocateAsyncTrainer(AsyncTrainerHooks):
    def on_sample_begin(self, step: int, local_update: int) -> None:
        if local_update:  # later local updates of a global step sample with the same weights
            self.pools.rollout.wake_up()
            self.pools.rollout.resume_generation()

    def on_sample_end(self, step: int, local_update: int) -> None:
        self.pools.rollout.pause_generation()
        self.pools.rollout.sleep()

    def on_step_end(self, step: int, run: PhaseRunner) -> dict[str, float]:
        metrics = run(tasks.weight_sync, self.run_id, step)
        self.context.version = step
        self.pools.rollout.wake_up()
        self.pools.rollout.resume_generation()
        return {**metrics, **self.step_metrics()}
