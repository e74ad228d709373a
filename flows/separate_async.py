"""``separate_async`` (R-2.6 - R-2.8): a standalone rollout pool that never stops generating.

The rollout replicas keep writing to the TransferQueue while the trainer runs
``parameter_sync_step`` local updates per global step; at step end the new weights are
pushed without waiting (the previous push is awaited first, so at most one is in flight)
and partial rollouts continue under them. pi_old stays the weights of local update 0
through a CPU snapshot on each rank. When the queue cannot supply a batch within
``replay.rescue_after_seconds``, rank 0's spare engine generates fresh groups in place.
"""

from __future__ import annotations

from typing import Any, ClassVar

import ray

from rl_train import tasks
from rl_train.config import Config
from rl_train.flows.async_hooks import AsyncTrainerHooks
from rl_train.flows.registry import register_trainer
from rl_train.flows.step import PhaseRunner


@register_trainer("separate_async")
class SeparateAsyncTrainer(AsyncTrainerHooks):
    mode_defaults: ClassVar[dict[str, Any]] = {
        **AsyncTrainerHooks.mode_defaults,
        "trainer.parameter_sync_step": 4,
        "rollout.weight_sync.backend": "bucketed",  # pushes cross pools
        # staleness <= parameter_sync_step versions behind, i.e. staleness <= pss + 1,
        # also for groups that a long tool call kept out past their step: older ones are evicted.
        "replay.max_off_policy_threshold": lambda data: int(data["trainer"]["parameter_sync_step"]) + 1,
    }

    @classmethod
    def config_errors(cls, config: Config) -> list[str]:
        t, errors = config.trainer, []
        mini = config.actor.ppo_mini_batch_size or t.train_batch_size // t.parameter_sync_step
        if t.train_batch_size != t.parameter_sync_step * mini:
            errors.append(
                f"trainer.train_batch_size ({t.train_batch_size}) must equal trainer.parameter_sync_step "
                f"({t.parameter_sync_step}) x actor.ppo_mini_batch_size ({mini}) in separate_async: "
                f"each local update is one mini-batch (set actor.ppo_mini_batch_size to "
                f"{t.train_batch_size // t.parameter_sync_step} or null)"
            )
        if config.rollout.num_replicas < 1:
            errors.append("rollout.num_replicas: separate_async needs a standalone rollout pool (> 0)")
        if config.rollout.weight_sync.backend == "naive":
            errors.append(
                "rollout.weight_sync.backend: 'naive' hands weights over in one process; "
                "separate_async pushes across pools: use 'bucketed' or 'delta'"
            )
        return errors

    def on_train_begin(self) -> None:
        super().on_train_begin()
        self.replay_buffer.rescue = self._rescue

    def on_sample_begin(self, step: int, local_update: int) -> None:
        if local_update == 0 and self.config.trainer.parameter_sync_step > 1:
            ray.get([rank.snapshot_pi_old.remote() for rank in self.pools.trainers])

    def on_sample_end(self, step: int, local_update: int) -> None:
        return None  # the standalone pool never sleeps

    def on_step_end(self, step: int, run: PhaseRunner) -> dict[str, float]:
        ray.get([rank.clear_pi_old.remote() for rank in self.pools.trainers])
        metrics = run(tasks.push_weights, self.run_id, step)
        return {**metrics, **self.step_metrics()}

    def on_train_end(self) -> None:
        try:
            if self.context is not None:
                tasks.finish_push(self.run_id)
        finally:
            super().on_train_end()

    def _rescue(self, keys: list[str]) -> None:
        assert self.context is not None
        buffer = self.replay_buffer
        rank0 = self.pools.trainers[0]
        ray.get(rank0.rescue_generate.remote("train", keys, buffer.n, buffer.sampling, self.context.version))
