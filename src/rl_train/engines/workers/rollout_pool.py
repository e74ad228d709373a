"""The rollout pool: its replicas' generation and lifecycle as the driver drives them.

Sleep and wake free the devices for training in the colocated modes; pause, resume and stop
hold background generation (async modes): a pause stops the engines only (tool calls in
flight go on, ``GenerationLoop.pause``), a stop, at the end of a run, ends everything in
flight. Each replica is also a ``RolloutClient``, which the replay buffers drive one by one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.errors import RunGoneError
from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.pending import Actor, RayPending, wait_all
from rl_train.engines.workers.ranked_pool import kill_actors, split_keys

if TYPE_CHECKING:
    from rl_train.config import Config
    from rl_train.storage.checkpoint_manifest import PartEntry

ROLLOUT_MAX_RESTARTS = 3
"""A rollout replica that dies is restarted by Ray, then reloaded by ``WorkerPools.revive_rollouts``."""


class RolloutClient:
    """One replica, as the replay buffers drive it (``GeneratingReplica`` and ``QueueingReplica``)."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def start_generating(
        self, partition: str, keys: list[str], n: int, params: dict[str, Any]
    ) -> RayPending[list[str]]:
        return RayPending(self.actor.generate_prompts.remote(partition, keys, n, params))

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        self.actor.enqueue.remote(partition, keys, n, params)


@dataclass
class RolloutPool:
    replicas: list[RolloutClient]
    known_incarnations: list[str] = field(default_factory=list)
    """Each replica's incarnation when last seen: a different one means Ray restarted it."""

    @classmethod
    def launch(
        cls,
        launcher: ActorLauncher,
        actor_cls: type,
        config: Config,
        queue: NamedActor,
        places: list[dict[str, Any]],
        scorers: list[NamedActor] | None = None,
        teachers: list[NamedActor] | None = None,
    ) -> RolloutPool:
        """Ask Ray for ``rollout.num_replicas`` replicas (``places``: each one's placement options;
        ``scorers``: the reward workers each hands its finished groups to, ``reward.streaming``;
        ``teachers``: the teacher workers it hands them to as well, ``teacher.streaming``)."""
        rollout = config.rollout
        arguments: dict[str, Any] = {
            "model_path": str(config.model.path),
            "tq": queue,
            "num_threads": rollout.num_threads,
            "tool_env": rollout.tool_env.model_dump(),
            "engine": rollout.engine,
            "engine_options": rollout.engine_options(config.model.impl),
            "device": rollout.device,
            "agent": rollout.agent.model_dump(),
            "sandbox": config.sandbox.model_dump(),
            "scorers": list(scorers or []),
            "teachers": list(teachers or []),
        }
        return cls(
            [
                RolloutClient(
                    launcher.start(
                        actor_cls,
                        f"rollout-{i}",
                        {**arguments, "seed": config.run.seed + 1000 * i},
                        max_concurrency=2,
                        max_restarts=ROLLOUT_MAX_RESTARTS,
                        **places[i],
                    )
                )
                for i in range(rollout.num_replicas)
            ]
        )

    @classmethod
    def rejoin(cls, namespace: str, num_replicas: int) -> RolloutPool:
        return cls([RolloutClient(ray.get_actor(f"rollout-{i}", namespace=namespace)) for i in range(num_replicas)])

    @property
    def actors(self) -> list[Actor]:
        return [replica.actor for replica in self.replicas]

    def _each(self, calls: list[Any]) -> list[Any]:
        """The results of one call per replica (``calls``: their object references), in order."""
        return list(ray.get(calls))

    def generate(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        """Blocking generation of ``keys`` spread over the replicas; returns the trajectory keys."""
        shards = split_keys(keys, len(self.replicas))
        pending = [r.start_generating(partition, s, n, params) for r, s in zip(self.replicas, shards, strict=True) if s]
        return [key for part in wait_all(pending) for key in part]

    def sleep(self) -> None:
        """Free rollout memory for training (weights and KV cache leave the device)."""
        self._each([actor.sleep.remote() for actor in self.actors])

    def wake_up(self) -> None:
        self._each([actor.wake_up.remote() for actor in self.actors])

    def pause_generation(self, missing_ok: bool = False) -> None:
        """Pause the engines (in-flight requests kept as partial rollouts; tool calls in flight go
        on) and hold background generation until ``resume_generation``.

        ``missing_ok``: a replica that has already died is not an error (teardown paths)."""
        self._on_each([actor.pause_generation.remote() for actor in self.actors], missing_ok)

    def resume_generation(self) -> None:
        self._each([actor.resume_generation.remote() for actor in self.actors])

    def stop_generation(self, missing_ok: bool = False) -> None:
        """End background generation, tool waits included (the end of a run)."""
        self._on_each([actor.stop_generation.remote() for actor in self.actors], missing_ok)

    def _on_each(self, calls: list[Any], missing_ok: bool) -> None:
        if not missing_ok:
            self._each(calls)
            return
        for call in calls:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(call)

    def pop_generation_errors(self) -> list[str]:
        """Errors raised in the replicas' background generation since the last call."""
        per_replica = self._each([actor.pop_generation_errors.remote() for actor in self.actors])
        return [error for errors in per_replica for error in errors]

    def versions(self) -> list[int]:
        """The weight version each replica serves."""
        return [int(v) for v in self._each([actor.version.remote() for actor in self.actors])]

    def pop_activity(self) -> list[dict[str, float]]:
        """Each replica's engine-busy seconds, batches and groups awaiting tools since the last call."""
        return self._each([actor.pop_activity.remote() for actor in self.actors])

    def mark_next_push_off_version(self) -> None:
        self._each([actor.mark_next_push_off_version.remote() for actor in self.actors])

    def where(self) -> list[dict[str, str]]:
        """The node each replica runs on: ``{"node_id", "ip"}``."""
        return self._each([actor.where.remote() for actor in self.actors])

    # -- restarts ----------------------------------------------------------------------------
    def remember_incarnations(self) -> None:
        self.known_incarnations = self._each([actor.incarnation.remote() for actor in self.actors])

    def current_incarnations(self, wait_seconds: float) -> list[str]:
        """Each replica's incarnation now, waiting up to ``wait_seconds`` for one that Ray is
        restarting; ``RunGoneError`` when one does not come back."""
        deadline = time.monotonic() + wait_seconds
        current: list[str] = []
        for i, actor in enumerate(self.actors):
            while True:
                try:
                    current.append(ray.get(actor.incarnation.remote(), timeout=max(deadline - time.monotonic(), 1.0)))
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:  # restarting
                    if time.monotonic() > deadline:
                        raise RunGoneError(
                            f"rollout replica {i} died and did not come back within {wait_seconds:.0f}s "
                            f"(it restarts at most {ROLLOUT_MAX_RESTARTS} times): {exc}"
                        ) from exc
                    time.sleep(0.5)
        return current

    # -- checkpoint (R-9.2, R-9.3) -----------------------------------------------------------
    def start_checkpoint_write(
        self, root: str, step: int, storage_options: dict[str, Any] | None
    ) -> list[RayPending[list[PartEntry]]]:
        """Each replica writes its sampling stream and RNG as parts of checkpoint ``step``."""
        return [
            RayPending(actor.save_checkpoint.remote(root, step, storage_options, i))
            for i, actor in enumerate(self.actors)
        ]

    def start_checkpoint_load(
        self, root: str, step: int, storage_options: dict[str, Any] | None
    ) -> list[RayPending[None]]:
        return [
            RayPending(actor.load_checkpoint.remote(root, step, storage_options, i))
            for i, actor in enumerate(self.actors)
        ]

    def kill(self) -> None:
        kill_actors(self.actors)
