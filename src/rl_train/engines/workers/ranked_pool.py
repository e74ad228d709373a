"""What the training and critic pools share: ranks that meet in one torch.distributed world.

The ranks are created without a world; once they are up, rank 0 names an address on its node
(``rendezvous_address``) and every rank joins the world there (``start``). A rank's work on
a batch is its shard of the batch's keys; every rank runs the same number of optimizer steps,
and the update's metrics are the mean over the ranks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.pending import Actor, RayPending

if TYPE_CHECKING:
    from rl_train.storage.checkpoint_manifest import PartEntry

CHECKPOINT_GROUP = "checkpoint"
"""The ranks' concurrency group for checkpoint writes, beside the next step's work."""


@dataclass
class RankedPool:
    ranks: list[Actor]

    def meet(self) -> None:
        """Join the pool's ranks in one world at rank 0's address (a single rank needs none)."""
        if len(self.ranks) > 1:
            address = ray.get(self.ranks[0].rendezvous_address.remote())
            ray.get([rank.start.remote(address) for rank in self.ranks])

    def ping(self) -> None:
        """Wait until every rank is constructed and answers."""
        ray.get([rank.ping.remote() for rank in self.ranks])

    def kill(self) -> None:
        kill_actors(self.ranks)

    # -- checkpoint (R-9.2, R-9.3) -----------------------------------------------------------
    def start_checkpoint_snapshot(self, with_policy: bool) -> list[RayPending[None]]:
        """Each rank copies its state to host memory (the next update may start once it has)."""
        return [RayPending(rank.snapshot_checkpoint.remote(with_policy)) for rank in self.ranks]

    def start_checkpoint_write(
        self, root: str, step: int, storage_options: dict[str, Any] | None
    ) -> list[RayPending[list[PartEntry]]]:
        """Each rank writes its snapshot as parts of checkpoint ``step``, in its checkpoint thread."""
        return [
            RayPending(
                rank.write_checkpoint.options(concurrency_group=CHECKPOINT_GROUP).remote(root, step, storage_options)
            )
            for rank in self.ranks
        ]

    def start_checkpoint_load(
        self, root: str, step: int, storage_options: dict[str, Any] | None
    ) -> list[RayPending[None]]:
        return [RayPending(rank.load_checkpoint.remote(root, step, storage_options)) for rank in self.ranks]


def split_keys(keys: list[str], parts: int) -> list[list[str]]:
    """``keys`` dealt round robin into ``parts`` shards."""
    return [keys[i::parts] for i in range(parts)]


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the ranks that report it (a rank without the key does not dilute it)."""
    keys = {k for metrics in per_rank for k in metrics}
    return {
        k: sum(m[k] for m in per_rank if k in m) / max(sum(k in m for m in per_rank), 1) for k in sorted(keys)
    }


def kill_actors(actors: list[Actor]) -> None:
    """Kill each actor, never restarted; one already gone is skipped."""
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
