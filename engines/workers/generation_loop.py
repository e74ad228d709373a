"""A rollout replica's background generation: the non-blocking side of dispatch (R-5.1).

``enqueue`` returns at once; one thread drains the queue, generating every queued group of
the same kind as one engine batch. ``hold`` stops generation at the next token (the engine's
abort returns partial results, which the replica keeps and re-queues first) and waits until
the engine is idle: weight pushes and sleep happen under a hold, so a partial rollout resumes
under the new weights. Holds nest: each ``hold`` needs its ``release``.

With ``batches_in_flight`` above 1, as many threads each drain the queue, each taking an even
share of it: while one batch waits on its tools, another generates (the caller merges their
engine calls into shared batches, ``turn_taking.py``). ``stopping`` is set
from a ``hold`` until the last ``release``: a batch waiting on tools ends what it has in flight
as aborted rather than keep the hold waiting for its slowest call.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

Job = tuple[str, int, tuple[tuple[str, Any], ...]]
"""(partition, n, sampling params as sorted items): groups with equal jobs share a batch."""


class GenerationLoop:
    def __init__(
        self,
        run: Callable[[str, list[str], int, dict[str, Any]], list[str]],
        abort: Callable[[], Any],
        max_groups_per_batch: int = 64,
        batches_in_flight: int = 1,
    ) -> None:
        """``run`` generates groups and returns the keys it left unfinished (aborted)."""
        self._run, self._abort = run, abort
        self._max_groups = max_groups_per_batch
        self._batches_in_flight = batches_in_flight
        self._queue: deque[tuple[Job, str]] = deque()
        self._cond = threading.Condition()
        self._holds = 0
        self._busy = 0
        """Batches being generated now."""
        self._threads: list[threading.Thread] = []
        self.stopping = threading.Event()
        self.errors: list[str] = []

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        job = (partition, n, tuple(sorted(params.items())))
        with self._cond:
            self._queue.extend((job, key) for key in keys)
            while len(self._threads) < self._batches_in_flight:
                thread = threading.Thread(target=self._loop, name=f"generation-loop-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def hold(self, poll_seconds: float = 0.02) -> None:
        """Stop generating (in-flight groups return partial) and wait until the engine is idle."""
        with self._cond:
            self._holds += 1
            self.stopping.set()
            while self._busy:
                self._abort()  # repeated: an abort that lands before a batch starts is cleared by it
                self._cond.wait(poll_seconds)

    def release(self) -> None:
        with self._cond:
            self._holds = max(self._holds - 1, 0)
            if not self._holds:
                self.stopping.clear()
            self._cond.notify_all()

    def pop_errors(self) -> list[str]:
        """The errors recorded since the last call."""
        with self._cond:
            errors, self.errors = self.errors, []
        return errors

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def _next_batch(self) -> tuple[Job, list[str]]:
        with self._cond:
            while self._holds or not self._queue:
                self._cond.wait()
            job, key = self._queue.popleft()
            keys = [key]
            share = self._share(job)
            rest: deque[tuple[Job, str]] = deque()
            while self._queue and len(keys) < share:
                item = self._queue.popleft()
                if item[0] == job:
                    keys.append(item[1])
                else:
                    rest.append(item)
            self._queue.extendleft(reversed(rest))
            self._busy += 1
            return job, keys

    def _share(self, job: Job) -> int:
        """How many of ``job``'s queued groups this batch takes (the first already taken): an
        even share among the threads free to take one, so that the queue spreads over every
        batch in flight (a batch holds its groups until its slowest tool answers) rather than
        filling one; at most ``max_groups_per_batch``."""
        free = max(self._batches_in_flight - self._busy, 1)
        queued = 1 + sum(1 for item in self._queue if item[0] == job)
        return min(self._max_groups, -(-queued // free))

    def _loop(self) -> None:
        while True:
            (partition, n, params), keys = self._next_batch()
            unfinished: list[str] = []
            try:
                unfinished = self._run(partition, keys, n, dict(params))
            except Exception as exc:  # the prompts are tagged failure; the buffer retries them
                with self._cond:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    job = (partition, n, params)
                    self._queue.extendleft((job, key) for key in reversed(unfinished))
                    self._busy -= 1
                    self._cond.notify_all()
