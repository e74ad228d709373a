"""The training pool: the policy's ranks, which compute log-probs, update, and hold pi_old.

Each rank gets the batch shard of its data-parallel index: the ranks that split one model
(tensor or pipeline parallel) share a shard. When the model is split, every export of rank 0
(a weight push, a saved policy, the spare engine's weights) is a collective that the other
ranks join (``join_export``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.pending import Actor, RayPending, wait_all
from rl_train.engines.workers.ranked_pool import CHECKPOINT_GROUP, RankedPool, mean_over_ranks

if TYPE_CHECKING:
    from rl_train.config import Config

SYNC_GROUP = "weight_sync"
"""The ranks' concurrency group for pushes: a push runs beside the next step's work."""


@dataclass
class TrainerPool(RankedPool):
    split_model: bool = False
    """The model is split over the ranks (tensor or pipeline parallel, FSDP shards)."""
    data_parallel_ranks: list[int] = field(default_factory=list)
    """Each rank's data-parallel index (read once the ranks are up; empty: one per rank)."""
    pi_old_pinned: bool = False
    """Between ``snapshot_pi_old`` and ``clear_pi_old``: the weights have moved past the
    version the rollout replicas are tagged with."""

    @classmethod
    def launch(
        cls, launcher: ActorLauncher, actor_cls: type, config: Config, queue: Actor, places: list[dict[str, Any]]
    ) -> TrainerPool:
        """Ask Ray for ``actor.num_ranks`` ranks (``places``: each rank's placement options)."""
        world = config.actor.num_ranks
        arguments: dict[str, Any] = {
            "world_size": world,
            "model_path": str(config.model.path),
            "actor": config.actor.model_dump(),
            "horizon_steps": config.optimizer_horizon_steps,
            "temperature": config.rollout.temperature,
            "seed": config.run.seed,
            "tq": queue,
            "dist_address": None,  # joined at rank 0's address once up (``meet``)
            "with_reference": config.actor.kl_loss or config.algorithm.kl_in_reward,
            "tool_env": config.rollout.tool_env.model_dump(),  # the spare rescue engine meets the same tools
            "rollout_engine": config.rollout.engine,
            "rollout_options": config.rollout.engine_options(config.model.impl),
            "model_impl": config.model.impl,
            "agent": config.rollout.agent.model_dump(),
            "sandbox": config.sandbox.model_dump(),
        }
        groups = {SYNC_GROUP: 1, CHECKPOINT_GROUP: 1}
        ranks = [
            launcher.start(actor_cls, f"trainer-{rank}", {"rank": rank, **arguments}, groups, **places[rank])
            for rank in range(world)
        ]
        megatron = config.actor.megatron
        split = megatron.tensor_parallel_size * megatron.pipeline_parallel_size
        return cls(ranks, split_model=split > 1 or (config.actor.fsdp and world > 1))

    @classmethod
    def rejoin(cls, namespace: str, num_ranks: int) -> TrainerPool:
        return cls([ray.get_actor(f"trainer-{i}", namespace=namespace) for i in range(num_ranks)])

    def read_data_parallel_ranks(self) -> None:
        self.data_parallel_ranks = list(ray.get([rank.data_parallel_rank.remote() for rank in self.ranks]))

    @property
    def num_shards(self) -> int:
        """How many data-parallel shards a batch is balanced into."""
        return max(self.data_parallel_ranks, default=len(self.ranks) - 1) + 1

    @property
    def rank0(self) -> Actor:
        return self.ranks[0]

    def start_peer_exports(self, sync: bool = False) -> list[RayPending[None]]:
        """The other ranks' share of rank 0's next export (none unless the model is split);
        started before it, as each rank runs its calls in order. ``sync``: that export is a
        weight sync's (``export_for_sync``), else the whole policy's."""
        peers = self.ranks[1:] if self.split_model else []
        return [RayPending(peer.join_export.remote(sync)) for peer in peers]

    def _by_data_rank(self, shards: list[list[str]]) -> list[tuple[Actor, list[str]]]:
        dp_ranks = self.data_parallel_ranks or list(range(len(self.ranks)))
        return [(rank, shards[dp]) for rank, dp in zip(self.ranks, dp_ranks, strict=True)]

    def compute_log_probs(self, shards: list[list[str]], out_field: str, reference: bool) -> None:
        """A forward-only pass on every rank over its shard, written as ``out_field``."""
        ray.get(
            [
                rank.compute_log_probs.remote("train", shard, out_field, reference)
                for rank, shard in self._by_data_rank(shards)
            ]
        )

    def update(self, shards: list[list[str]], num_mini_batches: int) -> dict[str, float]:
        """Actor update on every rank (the same number of steps each); the mean over ranks."""
        per_rank = ray.get(
            [rank.update.remote("train", shard, num_mini_batches) for rank, shard in self._by_data_rank(shards)]
        )
        return mean_over_ranks(per_rank)

    # -- separate_async: pi_old and the spare engine ---------------------------------------
    def snapshot_pi_old(self) -> None:
        ray.get([rank.snapshot_pi_old.remote() for rank in self.ranks])
        self.pi_old_pinned = True

    def clear_pi_old(self) -> None:
        ray.get([rank.clear_pi_old.remote() for rank in self.ranks])
        self.pi_old_pinned = False

    def rescue_generate(self, keys: list[str], n: int, params: dict[str, Any], version: int) -> None:
        """Starvation rescue (R-2.7): rank 0's spare engine generates ``keys`` into the queue."""
        peers = self.start_peer_exports()
        ray.get(self.rank0.rescue_generate.remote("train", keys, n, params, version))
        wait_all(peers)

    def export_policy(self, uri: str) -> list[str]:
        """The policy as an HF model directory at ``uri`` (rank 0 holds the whole model)."""
        peers = self.start_peer_exports()
        files = list(ray.get(self.rank0.export_policy.remote(uri)))
        wait_all(peers)
        return files

    def where(self) -> list[dict[str, str]]:
        """The node each rank runs on: ``{"node_id", "ip"}``."""
        return list(ray.get([rank.where.remote() for rank in self.ranks]))
