"""The teacher pool: stateless workers that score trajectories for distillation (R-4.10).

It follows the reward pool's rules: each prompt group goes whole to one worker (``owner_of``),
the workers score at once, a worker that dies is restarted by Ray (``TEACHER_MAX_RESTARTS``)
and the retried ``teacher`` phase scores what it had not written. With ``teacher.streaming`` the
rollout replicas hand each finished group to the same owner as it finishes, and the phase finds
most of the batch scored already. A run whose loss reads no
teacher has an empty pool: every call is then a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.workers.launched import ActorLauncher
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.pending import Actor, RayPending, wait_all
from rl_train.engines.workers.ranked_pool import kill_actors
from rl_train.storage.group_scoring import owner_of

if TYPE_CHECKING:
    from rl_train.config import Config

TEACHER_MAX_RESTARTS = 3
"""A teacher worker holds no state but its model: Ray restarts it and the retried phase goes on."""


def num_teacher_workers(teacher: dict[str, Any]) -> int:
    """Actors of the teacher pool, from a ``teacher`` config section as data (0: no teacher)."""
    return int(teacher["num_workers"]) if teacher.get("path") else 0


@dataclass
class TeacherPool:
    workers: list[Actor] = field(default_factory=list)

    @classmethod
    def launch(
        cls,
        launcher: ActorLauncher,
        actor_cls: type,
        config: Config,
        queue: NamedActor,
        places: list[dict[str, Any]] | None = None,
    ) -> TeacherPool:
        """Ask Ray for ``teacher.num_workers`` workers (none without ``teacher.path``); ``places``:
        each one's placement options (``placement.plan_placement``'s ``teachers``)."""
        count = num_teacher_workers(config.teacher.model_dump())
        places = places or [{} for _ in range(count)]
        arguments = {"student_path": str(config.model.path), "tq": queue, "teacher": config.teacher.model_dump(mode="json")}
        return cls(
            [
                launcher.start(actor_cls, f"teacher-{i}", arguments, max_restarts=TEACHER_MAX_RESTARTS, **places[i])
                for i in range(count)
            ]
        )

    @classmethod
    def rejoin(cls, namespace: str, num_workers: int) -> TeacherPool:
        return cls([ray.get_actor(f"teacher-{i}", namespace=namespace) for i in range(num_workers)])

    def ping(self) -> None:
        """Wait until every worker has loaded the teacher and checked its tokenizer."""
        ray.get([worker.ping.remote() for worker in self.workers])

    def score(self, partition: str, keys: list[str]) -> dict[str, float]:
        """Teacher fields on every trajectory of ``keys``: each prompt group's on the group's
        owner, the workers at once. Returns the counts summed over the workers
        (``TeacherWorker.score``) and the slowest worker's time."""
        if not self.workers:
            return {}
        shards: list[list[str]] = [[] for _ in self.workers]
        for key in keys:
            shards[owner_of(key.rsplit("/", 1)[0], len(self.workers))].append(key)
        busy = [(w, s) for w, s in zip(self.workers, shards, strict=True) if s]
        parts: list[dict[str, float]] = wait_all([RayPending(w.score.remote(partition, s)) for w, s in busy])
        totals: dict[str, float] = {}
        for part in parts:
            for name, value in part.items():
                combine = max if name == "teacher/seconds" else sum
                totals[name] = combine((totals.get(name, 0.0), value))
        return totals

    def kill(self) -> None:
        kill_actors(self.workers)
