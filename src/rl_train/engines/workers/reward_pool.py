"""The reward pool: stateless workers that score trajectories where the records are.

A worker that dies is restarted by Ray (``REWARD_MAX_RESTARTS``) and the retried reward task
goes on. Each worker is also a ``RewardScorer`` (``storage/handles.py``) for the replay
buffers' group filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray

from rl_train.engines.reward.metrics import ScoredSample
from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.pending import Actor, RayPending, wait_all
from rl_train.engines.workers.ranked_pool import kill_actors
from rl_train.storage.group_scoring import split_by_group

if TYPE_CHECKING:
    from rl_train.config import Config

REWARD_MAX_RESTARTS = 3
"""A reward worker holds no state: Ray restarts it and the retried reward task goes on."""


class RewardClient:
    """One reward worker."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def start_score(self, partition: str, keys: list[str]) -> RayPending[list[ScoredSample]]:
        return RayPending(self.actor.score.remote(partition, keys))

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        """Write ``reward`` and ``is_infra`` on each trajectory of ``keys``; returns the results in key order."""
        return self.start_score(partition, keys).wait()


@dataclass
class RewardPool:
    workers: list[RewardClient]

    @classmethod
    def launch(cls, launcher: ActorLauncher, actor_cls: type, config: Config, queue: NamedActor) -> RewardPool:
        arguments = {
            "model_path": str(config.model.path),
            "tq": queue,
            "reward": config.reward.model_dump(mode="json"),
            "sandbox": config.sandbox.model_dump(mode="json"),
            "group_size": config.rollout.n,
        }
        return cls(
            [
                RewardClient(
                    launcher.start(actor_cls, f"reward-{i}", arguments, max_restarts=REWARD_MAX_RESTARTS)
                )
                for i in range(config.reward.num_workers)
            ]
        )

    @classmethod
    def rejoin(cls, namespace: str, num_workers: int) -> RewardPool:
        return cls([RewardClient(ray.get_actor(f"reward-{i}", namespace=namespace)) for i in range(num_workers)])

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        """Results of ``keys`` spread over the workers (written onto the records), shard by
        shard; a prompt group's trajectories stay on one worker (a group grader sees them all)."""
        shards = split_by_group(keys, len(self.workers))
        parts = wait_all([w.start_score(partition, s) for w, s in zip(self.workers, shards, strict=True) if s])
        return [sample for part in parts for sample in part]

    def kill(self) -> None:
        kill_actors([w.actor for w in self.workers])
