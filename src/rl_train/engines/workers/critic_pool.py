"""The critic pool: its own data-parallel ranks, which compute values and update the critic.

A run without a critic (``critic.enable`` off) has an empty pool: every call is then a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.pending import Actor
from rl_train.engines.workers.ranked_pool import CHECKPOINT_GROUP, RankedPool, mean_over_ranks, split_keys

if TYPE_CHECKING:
    from rl_train.config import Config


def num_critic_ranks(critic: dict[str, Any]) -> int:
    """Actors of the critic pool, from a ``critic`` config section as data (0: no critic)."""
    return int(critic["num_ranks"]) if critic["enable"] else 0


@dataclass
class CriticPool(RankedPool):
    @classmethod
    def launch(cls, launcher: ActorLauncher, actor_cls: type, config: Config, queue: Actor) -> CriticPool:
        world = num_critic_ranks(config.critic.model_dump())
        arguments: dict[str, Any] = {
            "world_size": world,
            "model_path": str(config.model.path),
            "critic": config.critic.model_dump(),
            "seed": config.run.seed,
            "tq": queue,
            "dist_address": None,  # joined at rank 0's address once up (``meet``)
        }
        groups = {CHECKPOINT_GROUP: 1}
        return cls(
            [launcher.start(actor_cls, f"critic-{rank}", {"rank": rank, **arguments}, groups) for rank in range(world)]
        )

    @classmethod
    def rejoin(cls, namespace: str, num_ranks: int) -> CriticPool:
        return cls([ray.get_actor(f"critic-{i}", namespace=namespace) for i in range(num_ranks)])

    def compute_values(self, keys: list[str]) -> None:
        """Critic values (V_old) of ``keys``, spread over the ranks, written on the records."""
        shards = split_keys(keys, len(self.ranks))
        ray.get([rank.compute_values.remote("train", shard) for rank, shard in zip(self.ranks, shards, strict=True)])

    def update(self, keys: list[str], num_mini_batches: int) -> dict[str, float]:
        """Critic update on every rank (the same number of steps each); the mean over ranks."""
        shards = split_keys(keys, len(self.ranks))
        per_rank = ray.get(
            [
                rank.update.remote("train", shard, num_mini_batches)
                for rank, shard in zip(self.ranks, shards, strict=True)
            ]
        )
        return mean_over_ranks(per_rank)
