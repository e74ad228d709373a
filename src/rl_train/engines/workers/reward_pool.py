"""The reward pool: stateless workers that score trajectories where the records are.

A worker that dies is restarted by Ray (``REWARD_MAX_RESTARTS``) and the retried reward task
goes on. Each worker is also a ``StreamingScorer`` (``storage/handles.py``) for the replay
buffers: the group filter scores on it, and with ``reward.streaming`` the async buffer hands it
again the groups a dead worker lost. Each prompt group goes whole to one worker (``owner_of``):
the one the rollout replicas hand it to as it finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.reward.metrics import ScoredSample
from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.pending import Actor, RayPending, wait_all
from rl_train.engines.workers.ranked_pool import kill_actors
from rl_train.storage.group_scoring import owner_of

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

    def submit(self, partition: str, groups: list[str], n: int) -> None:
        """Queue groups to score in the background; returns at once (``reward.streaming``)."""
        self.actor.submit.remote(partition, groups, n)

    def streamed(self) -> dict[str, int]:
        """Groups scored in the background so far, and those pending (``RewardWorker.streamed``)."""
        return dict(ray.get(self.actor.streamed.remote()))


@dataclass
class RewardPool:
    workers: list[RewardClient]

    @classmethod
    def launch(
        cls,
        launcher: ActorLauncher,
        actor_cls: type,
        config: Config,
        queue: NamedActor,
        places: list[dict[str, Any]] | None = None,
    ) -> RewardPool:
        """Ask Ray for ``reward.num_workers`` workers (``places``: each one's placement options,
        ``placement.plan_placement``'s ``rewards``)."""
        places = places or [{} for _ in range(config.reward.num_workers)]
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
                    launcher.start(
                        actor_cls, f"reward-{i}", arguments, max_restarts=REWARD_MAX_RESTARTS, **places[i]
                    )
                )
                for i in range(config.reward.num_workers)
            ]
        )

    @classmethod
    def rejoin(cls, namespace: str, num_workers: int) -> RewardPool:
        return cls([RewardClient(ray.get_actor(f"reward-{i}", namespace=namespace)) for i in range(num_workers)])

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        """Results of ``keys`` (written onto the records), in key order: each prompt group's
        trajectories on the group's owner (``owner_of``), the workers at once."""
        shards: list[list[str]] = [[] for _ in self.workers]
        for key in keys:
            shards[owner_of(key.rsplit("/", 1)[0], len(self.workers))].append(key)
        busy = [(w, s) for w, s in zip(self.workers, shards, strict=True) if s]
        parts = wait_all([w.start_score(partition, s) for w, s in busy])
        found = {key: sample for (_, shard), part in zip(busy, parts, strict=True) for key, sample in zip(shard, part, strict=True)}
        return [found[key] for key in keys]

    def kill(self) -> None:
        kill_actors([w.actor for w in self.workers])
