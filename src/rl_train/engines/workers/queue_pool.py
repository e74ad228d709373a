"""The queue actor's phases and run state: what runs where the records live.

``records`` is the queue as a ``QueueStore`` (the replay buffers' view); the methods here are
the phases that only read and write records (balance, the bypass copies, advantages, ReMax's
greedy staging), the run's config and weight-sync handover flag, and the queue's share of a
checkpoint. Only batch ids and small dicts cross to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.pending import Actor, RayPending
from rl_train.engines.workers.queue_client import QueueClient
from rl_train.engines.workers.ranked_pool import kill_actors

if TYPE_CHECKING:
    from rl_train.config import Config
    from rl_train.storage.checkpoint_manifest import PartEntry

QUEUE_ACTOR = "transfer-queue"


@dataclass
class QueuePool:
    actor: Actor

    @classmethod
    def launch(cls, launcher: ActorLauncher, actor_cls: type, config: Config) -> QueuePool:
        """The run's queue, holding the resolved config (what a rejoining process reads)."""
        return cls(launcher.start(actor_cls, QUEUE_ACTOR, {"run_config": config.model_dump(mode="json")}))

    @classmethod
    def rejoin(cls, namespace: str) -> QueuePool:
        return cls(ray.get_actor(QUEUE_ACTOR, namespace=namespace))

    @property
    def records(self) -> QueueClient:
        return QueueClient(self.actor)

    def run_config(self) -> dict[str, Any]:
        """The run's resolved config, as data."""
        return dict(ray.get(self.actor.run_config.remote()))

    def warm_up(self) -> None:
        """Ask the queue to build, on a thread of its own, what it first needs after the first
        batch is generated (fire and forget: a failure shows at first use)."""
        self.actor.warm_up.remote()

    def set_weight_sync_handover(self, handover: bool) -> None:
        ray.get(self.actor.set_weight_sync_handover.remote(handover))

    def weight_sync_handover(self) -> bool:
        return bool(ray.get(self.actor.weight_sync_handover.remote()))

    # -- phases that run on the queue ---------------------------------------------------------
    def batch(self, batch_id: str, fields: list[str] | None = None) -> dict[str, Any]:
        """A batch's metadata (``keys``, ``groups``, ``shards``, ...): only ``fields`` if given."""
        return self.records.get_batch(batch_id, fields)

    def balance(self, batch_id: str, num_shards: int) -> dict[str, float]:
        """Split the batch into ``num_shards`` data-parallel shards of even token counts."""
        return dict(ray.get(self.actor.balance_batch.remote(batch_id, num_shards)))

    def copy_rollout_log_probs(self, batch_id: str) -> None:
        """Bypass mode (R-7.1): pi_old := the rollout log-probs."""
        ray.get(self.actor.copy_rollout_log_probs.remote(batch_id))

    def copy_current_log_probs(self, batch_id: str) -> tuple[list[list[str]], dict[str, float]]:
        """``bypass_current_version``: pi_old := the rollout log-probs of the trajectories that
        pi_old's weights sampled wholly; returns the shards left to recompute and the share copied."""
        shards, metrics = ray.get(self.actor.copy_current_log_probs.remote(batch_id))
        return shards, dict(metrics)

    def compute_advantages(self, batch_id: str) -> dict[str, float]:
        """Rollout correction, token rewards and advantages (R-7.1, R-7.4)."""
        return dict(ray.get(self.actor.compute_advantages.remote(batch_id)))

    def stage_greedy_prompts(self, batch_id: str) -> list[str]:
        """ReMax: the batch's prompts copied into the greedy partition; returns their keys."""
        return list(ray.get(self.actor.stage_greedy_prompts.remote(batch_id)))

    def set_baseline_rewards(self, batch_id: str, greedy_keys: list[str]) -> dict[str, float]:
        """ReMax: each trajectory's ``baseline_reward`` from its prompt's scored greedy answer."""
        return dict(ray.get(self.actor.set_baseline_rewards.remote(batch_id, greedy_keys)))

    # -- checkpoint (R-9.2, R-9.3) -----------------------------------------------------------
    def start_checkpoint_write(
        self, root: str, step: int, storage_options: dict[str, Any] | None
    ) -> RayPending[list[PartEntry]]:
        """The train partition and the advantage state, taken in one actor call."""
        return RayPending(self.actor.save_checkpoint.remote(root, step, storage_options))

    def start_checkpoint_load(
        self, root: str, step: int, storage_options: dict[str, Any] | None, version: int
    ) -> RayPending[list[str]]:
        """Restore the records; ``wait`` gives the prompt keys put back to pending."""
        return RayPending(self.actor.load_checkpoint.remote(root, step, storage_options, version))

    def kill(self) -> None:
        kill_actors([self.actor])
