"""A run's actors between being asked for and being ready (``WorkerPools.launch``).

``LaunchedPools.ready`` waits for them, joins each multi-rank pool at its rank 0's address
and opens the weight sync; ``abandon`` kills them. Either way, a failure leaves no actor,
placement group or weight-sync endpoint behind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import remove_placement_group

from rl_train import startup_clock

if TYPE_CHECKING:
    from rl_train.engines.workers.pools import WorkerPools


@dataclass
class LaunchedPools:
    """A run's actors as ``WorkerPools.launch`` asked for them: starting, not yet waited for."""

    pools: WorkerPools
    weight_sync: Any
    """The run's ``rollout.weight_sync`` section, opened once the actors are up."""
    created: list[Any]
    groups: list[Any]
    _done: bool = field(default=False, repr=False)

    def ready(self) -> WorkerPools:
        """Wait until every actor is up, join each multi-rank pool at its rank 0's address,
        open the weight sync and return the pools. On failure everything is killed (the
        weight sync closed first) before raising. Once only."""
        if self._done:
            raise RuntimeError("these pools were already made ready or abandoned")
        self._done = True
        pools = self.pools
        try:
            for ranks in (pools.trainers, pools.critics):  # each pool meets on its rank 0's node
                if len(ranks) > 1:
                    address = ray.get(ranks[0].rendezvous_address.remote())
                    ray.get([rank.start.remote(address) for rank in ranks])
            pools._incarnations = ray.get([r.incarnation.remote() for r in pools.rollouts])
            startup_clock.mark("rollout_ready")
            pools._dp_ranks = ray.get([t.data_parallel_rank.remote() for t in pools.trainers])
            ray.get([t.ping.remote() for t in (*pools.trainers, *pools.critics)])
            startup_clock.mark("trainer_ready")
            pools.open_weight_sync(self.weight_sync)
            pools.warm_up()
            return pools
        except BaseException:
            kill_launched(pools, self.created, self.groups)
            raise

    def abandon(self) -> None:
        """Kill every actor and remove the placement groups (idempotent; a no-op after ``ready``)."""
        if not self._done:
            self._done = True
            kill_launched(self.pools, self.created, self.groups)


def kill_launched(pools: WorkerPools | None, created: list[Any], groups: list[Any]) -> None:
    """Close what weight sync opened, kill every actor asked for and remove the placement groups."""
    if pools is not None:
        pools.shutdown()  # closes the sender and receivers opened so far, then kills
    for handle in created:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
    for group in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(group)
