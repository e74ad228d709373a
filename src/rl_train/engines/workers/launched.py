"""A run's actors between being asked for and being ready (``WorkerPools.launch``).

``ActorLauncher`` asks Ray for each actor and remembers it, so that a launch that fails half-way
kills what it asked for. ``LaunchedPools.ready`` waits for the actors, joins each multi-rank pool
at its rank 0's address and opens the weight sync; ``abandon`` kills them. Either way, a failure
leaves no actor, placement group or weight-sync endpoint behind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import remove_placement_group

from rl_train import startup_clock
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.pending import Actor

if TYPE_CHECKING:
    from rl_train.engines.weight_sync.config import WeightSyncConfig
    from rl_train.engines.workers.pools import WorkerPools


@dataclass
class ActorLauncher:
    """Creates a run's actors in its namespace, each named, and remembers every one created."""

    namespace: str
    created: list[Actor] = field(default_factory=list)

    def start(
        self,
        actor_cls: type,
        name: str,
        arguments: dict[str, Any],
        concurrency_groups: dict[str, int] | None = None,
        **options: Any,
    ) -> Actor:
        """Ask Ray for actor ``name`` of ``actor_cls``, constructed with the keyword
        ``arguments``; ``options`` are Ray's (GPUs, placement, restarts). The actor reserves no
        CPU (the pools share the machine's cores) and lives as long as the driver."""
        remote_cls: ray.actor.ActorClass[Any]
        if concurrency_groups:  # a decorator option only: ``.options()`` refuses it
            decorator: dict[str, Any] = {"concurrency_groups": concurrency_groups}
            remote_cls = ray.remote(**decorator)(actor_cls)
        else:
            remote_cls = ray.remote(actor_cls)
        handle = remote_cls.options(
            name=name, namespace=self.namespace, num_cpus=0, lifetime=None, **options
        ).remote(**arguments)
        self.created.append(handle)
        return handle

    def by_name(self, name: str) -> NamedActor:
        """``name`` as an actor Ray may restart is given it (see ``named_actor``)."""
        return NamedActor(name, self.namespace)


@dataclass
class LaunchedPools:
    """A run's actors as ``WorkerPools.launch`` asked for them: starting, not yet waited for."""

    pools: WorkerPools
    weight_sync: WeightSyncConfig
    """The run's ``rollout.weight_sync`` section, opened once the actors are up."""
    created: list[Actor]
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
            pools.trainer.meet()  # each pool meets on its rank 0's node
            pools.critic.meet()
            pools.rollout.remember_incarnations()
            startup_clock.mark("rollout_ready")
            pools.trainer.read_data_parallel_ranks()
            pools.trainer.ping()
            pools.critic.ping()
            pools.teacher.ping()  # the teacher loaded and its tokenizer checked: refused here, by name
            startup_clock.mark("trainer_ready")
            pools.weight_sync.open(self.weight_sync)
            pools.queue.warm_up()
            return pools
        except BaseException:
            kill_launched(pools, self.created, self.groups)
            raise

    def abandon(self) -> None:
        """Kill every actor and remove the placement groups (idempotent; a no-op after ``ready``)."""
        if not self._done:
            self._done = True
            kill_launched(self.pools, self.created, self.groups)


def kill_launched(pools: WorkerPools | None, created: list[Actor], groups: list[Any]) -> None:
    """Close what weight sync opened, kill every actor asked for and remove the placement groups."""
    if pools is not None:
        pools.shutdown()  # closes the sender and receivers opened so far, then kills
    for handle in created:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
    for group in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(group)
