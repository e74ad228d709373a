"""Streaming scores (``reward.streaming``, ``teacher.streaming``): prompt groups scored as
rollout finishes them.

Two sides, one module, shared by the reward pool and the teacher pool (each has its own
hand-off and its own sharding, ``owner_of`` over its own size):

- ``ScoreHandoff`` is the rollout replica's: when it tags a group ``finished`` it hands the
  group to its owner reward worker (``owner_of``) and goes on at once. The call carries the
  queue writes of the group as arguments, which Ray resolves before the reward worker runs
  it: the group's records are in the queue when it is read, though the two calls come from
  different processes (Ray orders calls per caller only).
- ``ScoringQueue`` is the reward worker's: the groups handed to it wait here and up to
  ``reward.max_concurrent_batches`` threads score them, each a batch at a time (the reward's
  ``score_batch`` sees many groups at once; an idle thread takes all that is queued). A grader
  slower than rollout's production then overlaps its batches rather than queueing them; the
  router still enters a reward by one thread at a time unless it declares ``concurrent``.
  A blocking caller (the reward phase, the group filter) *claims* its groups first: those
  still queued leave the queue, and it waits for those being scored now, so that no group is
  scored twice on one worker, and one scored in the background is then read back, not
  scored again.

A group's scores land on its records with the ``scored`` tag on its prompt in one queue call
(``TransferQueue.update``, which skips a group evicted meanwhile). A worker that dies loses
what was queued on it; its groups stay unscored, and the buffer hands them again (a worker
ignores a group it has queued, or one already scored), or the reward phase scores them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from rl_train.engines.workers.named_actor import NamedActor, resolve_actor
from rl_train.storage.group_scoring import groups_by_owner

logger = logging.getLogger(__name__)

MAX_GROUPS_PER_SCORING = 64
"""Groups scored in one background batch at most (one queue read, one reward call each)."""
STREAMED_PARTITION = "train"
"""Only training groups stream: validation and greedy answers are scored where they are made."""

Job = tuple[str, str, int]
"""(partition, group, trajectories per group)."""


class ScoreHandoff:
    """A rollout replica's side: hands finished groups to their scoring workers, never waiting."""

    def __init__(self, scorers: list[NamedActor], pool: str = "reward") -> None:
        """``scorers``: one pool's workers (``pool`` names it in warnings)."""
        self._names = scorers
        self._pool = pool
        self._actors: list[Any] | None = None
        """Resolved at the first hand-off: the scoring workers start after the replicas."""

    def __bool__(self) -> bool:
        return bool(self._names)

    def hand_off(self, partition: str, groups: list[str], n: int, after: list[Any] | None = None) -> None:
        """Hand ``groups`` (tagged finished by the writes ``after``) to their owners' queues."""
        if not self._names or partition != STREAMED_PARTITION or not groups:
            return
        try:
            if self._actors is None:
                self._actors = [resolve_actor(name) for name in self._names]
            for actor, owned in zip(self._actors, groups_by_owner(groups, len(self._actors)), strict=True):
                if owned:
                    actor.submit.remote(partition, owned, n, *(after or []))
        except Exception as exc:  # a worker not (yet) there: handed again by the buffer, or its phase scores them
            self._actors = None
            logger.warning(
                "streaming scores: could not hand %d group(s) to the %s pool: %s", len(groups), self._pool, exc
            )


class ScoringQueue:
    """A scoring worker's side: groups waiting to be scored, and the threads that score them."""

    def __init__(
        self, score_groups: Callable[[str, list[str], int], int], max_concurrent: int = 1, name: str = "reward"
    ) -> None:
        """``score_groups(partition, groups, n)`` scores the groups still unscored, writes their
        scores and returns how many it scored; ``max_concurrent``: batches scored at once;
        ``name``: the pool's, for its threads' names."""
        if max_concurrent < 1:
            raise ValueError(f"reward.max_concurrent_batches: {max_concurrent} is not allowed; it must be at least 1")
        self._score_groups = score_groups
        self._name = name
        self._max_concurrent = max_concurrent
        self._queue: deque[Job] = deque()
        self._queued: set[tuple[str, str]] = set()
        self._scoring: set[tuple[str, str]] = set()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        """Threads waiting for work: a new one starts only when none is idle (up to the cap)."""
        self.scored_groups = 0
        """Groups this worker scored in the background (a test reads it)."""

    def submit(self, partition: str, groups: list[str], n: int) -> int:
        """Queue the groups not queued or being scored already; returns how many were new."""
        with self._cond:
            new = [g for g in groups if (partition, g) not in self._queued and (partition, g) not in self._scoring]
            self._queue.extend((partition, g, n) for g in new)
            self._queued.update((partition, g) for g in new)
            if new and self._idle == 0 and len(self._threads) < self._max_concurrent:
                thread = threading.Thread(target=self._loop, name=f"{self._name}-stream-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()
            return len(new)

    def claim(self, partition: str, groups: list[str]) -> None:
        """Take ``groups`` out of the queue and wait for those being scored now to be written:
        the caller scores (or reads back) them itself."""
        wanted = {(partition, g) for g in groups}
        with self._cond:
            if wanted & self._queued:
                self._queue = deque(job for job in self._queue if (job[0], job[1]) not in wanted)
                self._queued -= wanted
            while wanted & self._scoring:
                self._cond.wait()

    def pending(self) -> int:
        """Groups queued or being scored."""
        with self._cond:
            return len(self._queued) + len(self._scoring)

    def _next(self) -> tuple[str, int, list[str]]:
        with self._cond:
            self._idle += 1
            while not self._queue:
                self._cond.wait()
            self._idle -= 1
            partition, group, n = self._queue.popleft()
            groups = [group]
            rest: deque[Job] = deque()
            while self._queue and len(groups) < MAX_GROUPS_PER_SCORING:
                job = self._queue.popleft()
                if job[0] == partition and job[2] == n:
                    groups.append(job[1])
                else:
                    rest.append(job)
            self._queue.extendleft(reversed(rest))
            taken = {(partition, g) for g in groups}
            self._queued -= taken
            self._scoring |= taken
            return partition, n, groups

    def _loop(self) -> None:
        while True:
            partition, n, groups = self._next()
            try:
                scored = self._score_groups(partition, groups, n)
                with self._cond:
                    self.scored_groups += scored
            except Exception as exc:  # left unscored: handed again by the buffer, or the pool's phase scores them
                logger.warning("streaming scores: %d group(s) left unscored: %s: %s", len(groups), type(exc).__name__, exc)
            finally:
                with self._cond:
                    self._scoring -= {(partition, g) for g in groups}
                    self._cond.notify_all()
