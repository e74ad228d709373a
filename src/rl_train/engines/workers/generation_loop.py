"""A rollout replica's background generation: the non-blocking side of dispatch (R-5.1).

``enqueue`` returns at once; one thread drains the queue, generating every queued group of
the same kind as one engine batch. Two ways to stop it, each nesting (each needs its undo):

- ``pause`` / ``resume`` (a weight push, the colocated mode's training, validation): the
  engine stops at the next token and no background engine call starts until the last
  ``resume``. Only the engine is paused: a multi-turn trajectory keeps its tokens (an
  interrupted turn continues under the new weights) and its tool call keeps running, so a
  push every step does not throw away the trajectories that wait on a slow sandbox. A
  single-turn batch returns its aborted groups, which are re-queued first and continue from
  their tokens. No new batch starts while paused.
- ``hold`` / ``release`` (the end of the run): everything in flight ends ``aborted``, tool
  waits included, and ``hold`` returns once no batch is left.

Background engine calls go through ``engine_call`` (``GatedEngine`` wraps an engine so), where
a pause makes them wait; a blocking caller (validation, sync mode's generation) calls the
engine directly and is never held by it.

With ``batches_in_flight`` above 1, as many threads each drain the queue, each taking an even
share of it: while one batch waits on its tools, another generates (the caller merges their
engine calls into shared batches, ``turn_taking.py``). A batch also takes more of its kind
while it runs (``run``'s ``more``): a multi-turn batch asks between rounds, so groups queued
while its slowest tools keep it busy start at its next round rather than when it ends; a
batch holds at most ``max_groups_per_batch`` unfinished groups at once, and takes
``ADMIT_LIFETIME`` times that over its life (it then ends as its last tools answer, and its
thread starts a new one). ``stopping`` is set from a ``hold``
until the last ``release``: a batch waiting on tools ends what it has in flight as aborted
rather than keep the hold waiting for its slowest call.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from rl_train.engines.rollout.protocol import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from rl_train.engines.workers.engine_wrapper import WrappedRolloutEngine

Job = tuple[str, int, tuple[tuple[str, Any], ...]]
"""(partition, n, sampling params as sorted items): groups with equal jobs share a batch."""
More = Callable[[int], list[str]]
"""A running batch's call for up to that many more queued groups of its job (none under a
pause or a hold)."""
ADMIT_LIFETIME = 4
"""A batch takes at most this many times ``max_groups_per_batch`` groups over its life."""


class GenerationLoop:
    def __init__(
        self,
        run: Callable[[str, list[str], int, dict[str, Any], More], list[str]],
        abort: Callable[[], Any],
        max_groups_per_batch: int = 64,
        batches_in_flight: int = 1,
    ) -> None:
        """``run`` generates groups (and those ``more`` gives it) and returns the keys it left
        unfinished (aborted)."""
        self._run, self._abort = run, abort
        self._max_groups = max_groups_per_batch
        self._batches_in_flight = batches_in_flight
        self._queue: deque[tuple[Job, str]] = deque()
        self._cond = threading.Condition()
        self._holds = 0
        self._pauses = 0
        self._in_engine = 0
        """Background engine calls running now (``engine_call``)."""
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
            self._cond.notify_all()  # engine calls waiting out a pause return aborted
            while self._busy:
                self._abort()  # repeated: an abort that lands before a batch starts is cleared by it
                self._cond.wait(poll_seconds)

    def release(self) -> None:
        with self._cond:
            self._holds = max(self._holds - 1, 0)
            if not self._holds:
                self.stopping.clear()
            self._cond.notify_all()

    def pause(self, poll_seconds: float = 0.02) -> None:
        """Stop the engine at the next token and keep background engine calls out until the last
        ``resume``; returns once none is running (a batch that got aborted results writes them
        just after). Tool calls in flight go on."""
        with self._cond:
            self._pauses += 1
            while self._in_engine:
                self._abort()  # repeated, as in ``hold``
                self._cond.wait(poll_seconds)

    def resume(self) -> None:
        with self._cond:
            self._pauses = max(self._pauses - 1, 0)
            self._cond.notify_all()

    def engine_call(
        self,
        generate: Callable[[list[GenerationRequest], SamplingParams], list[GenerationResult]],
        requests: list[GenerationRequest],
        params: SamplingParams,
    ) -> list[GenerationResult]:
        """A background engine call: it waits out a pause; under a hold it does not reach the
        engine (which may be asleep) and every request returns as it came, ``aborted``."""
        with self._cond:
            while self._pauses and not self.stopping.is_set():
                self._cond.wait()
            if self.stopping.is_set():
                return [
                    GenerationResult(r.request_id, list(r.prompt_ids), list(r.response_prefix), [], [], "aborted")
                    for r in requests
                ]
            self._in_engine += 1
        try:
            return generate(requests, params)
        finally:
            with self._cond:
                self._in_engine -= 1
                self._cond.notify_all()

    @property
    def max_groups_per_batch(self) -> int:
        return self._max_groups

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
            while self._holds or self._pauses or not self._queue:
                self._cond.wait()
            job, key = self._queue.popleft()
            keys = [key, *self._pop_queued(job, self._share(job) - 1)]
            self._busy += 1
            return job, keys

    def _pop_queued(self, job: Job, limit: int) -> list[str]:
        """Up to ``limit`` queued keys of ``job``, out of the queue in their order (under the lock);
        the other jobs' keep their places."""
        keys: list[str] = []
        rest: deque[tuple[Job, str]] = deque()
        while self._queue and len(keys) < limit:
            item = self._queue.popleft()
            if item[0] == job:
                keys.append(item[1])
            else:
                rest.append(item)
        self._queue.extendleft(reversed(rest))
        return keys

    def _more(self, job: Job, taken: list[int], wanted: int) -> list[str]:
        """Up to ``wanted`` more queued groups of ``job`` for a running batch (within its share,
        and its life's ``ADMIT_LIFETIME`` x ``max_groups_per_batch``; ``taken`` counts them)."""
        with self._cond:
            if self._holds or self._pauses or self.stopping.is_set():
                return []
            room = min(wanted, self._share(job, taking=False), ADMIT_LIFETIME * self._max_groups - taken[0])
            keys = self._pop_queued(job, room)
            taken[0] += len(keys)
            return keys

    def _share(self, job: Job, taking: bool = True) -> int:
        """How many of ``job``'s queued groups this batch takes (the first already taken): an
        even share among the threads free to take one, so that the queue spreads over every
        batch in flight (a batch holds its groups until its slowest tool answers) rather than
        filling one; at most ``max_groups_per_batch``."""
        free = max(self._batches_in_flight - self._busy, 1)
        queued = int(taking) + sum(1 for item in self._queue if item[0] == job)
        return min(self._max_groups, -(-queued // free))

    def _loop(self) -> None:
        while True:
            (partition, n, params), keys = self._next_batch()
            unfinished: list[str] = []
            taken = [len(keys)]
            job = (partition, n, params)
            try:
                unfinished = self._run(partition, keys, n, dict(params), partial(self._more, job, taken))
            except Exception as exc:  # the prompts are tagged failure; the buffer retries them
                with self._cond:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._queue.extendleft((job, key) for key in reversed(unfinished))
                    self._busy -= 1
                    self._cond.notify_all()


class GatedEngine(WrappedRolloutEngine):
    """An engine whose ``generate`` goes through a generation loop's ``engine_call``: what the
    background agent loops see. Every other member is the engine's own (``WrappedRolloutEngine``):
    only generation waits out a pause, while the weight sync that paused it drives the engine."""

    def __init__(self, engine: RolloutEngine, loop: GenerationLoop) -> None:
        super().__init__(engine)
        self._loop = loop

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return self._loop.engine_call(self._engine.generate, requests, params)
