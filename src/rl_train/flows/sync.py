"""``sync`` (R-2.4): rollout and training share the CPUs and strictly alternate.

After sampling, rollout sleeps (its memory is free for training); at step end the new
weights are pushed and rollout wakes. Staleness is always 0, so no eviction or IS is needed.
The next step's first generation round starts right after the weight sync (the replay
buffer's ``prefetch``), with the weights it will be trained against: the driver's own work
between two steps (metrics, the step's flow run ending and the next one starting) overlaps
it instead of leaving rollout idle.
"""

from __future__ import annotations

from rl_train import tasks
from rl_train.flows.base import BaseTrainer
from rl_train.flows.step import PhaseRunner


class SyncTrainer(BaseTrainer):
    def on_sample_begin(self, step: int, local_update: int) -> None:
        if local_update:  # parameter_sync_step > 1: the next local update samples with the same weights
            self.pools.rollout.wake_up()

    def on_sample_end(self, step: int, local_update: int) -> None:
        self.pools.rollout.sleep()

    def on_step_end(self, step: int, run: PhaseRunner) -> dict[str, float]:
        metrics = run(tasks.weight_sync, self.run_id, step)
        self.context.version = step
        self.pools.rollout.wake_up()
        prefetch = getattr(self.replay_buffer, "prefetch", None)  # a custom sampler may not have it
        if prefetch is not None and self.next_step_may_start(step):
            prefetch(self.config.trainer.train_batch_size // self.config.trainer.parameter_sync_step, step + 1)
        return {**metrics, **self.replay_buffer.pop_metrics()}
