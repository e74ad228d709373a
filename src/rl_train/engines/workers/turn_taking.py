"""A rollout replica's engine as its agent loops see it: one engine, several loops at once.

With ``rollout.agent.batches_in_flight`` above 1 several agent loops share the replica's
engine. A multi-turn loop generates the next turn of whichever of its trajectories' tool
calls have answered, so its calls are often a few requests each, and a decode step of a few
rows costs most of what one of many does (its kernels' fixed cost). So the loops' calls are
merged: while the engine runs one batch, the calls that arrive wait, and the next batch runs
every waiting call with the same sampling parameters as one engine batch, each call getting
its own results back. A call never waits for another to arrive: when the engine is free the
first waiting call runs at once. Calls with a seed run alone (a seed promises the samples of
that call by itself), and calls with other parameters take the next batch.

If a merged batch fails, each of its calls runs again alone, so one loop's bad request fails
that loop only. The time spent generating is counted as the replica's busy time, with the
engine batches run and the requests they held (``rollout/rows_per_engine_batch``).
``rollout/kv_reused_tokens`` counts the context tokens that kept keys and values spared the
engine prefilling again (the engine's ``kv_reused_tokens``: 0 for one that keeps none).

Every other ``RolloutEngine`` member is the engine's own (``WrappedRolloutEngine``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rl_train.engines.rollout.protocol import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from rl_train.engines.workers.engine_wrapper import WrappedRolloutEngine


@dataclass(eq=False)
class _Call:
    requests: list[GenerationRequest]
    params: SamplingParams
    done: bool = False
    results: list[GenerationResult] | None = None
    error: BaseException | None = None


class TurnTakingEngine(WrappedRolloutEngine):
    def __init__(self, engine: RolloutEngine) -> None:
        super().__init__(engine)
        self._cond = threading.Condition()
        self._running = False
        """An engine batch is running (its caller runs it outside the lock)."""
        self._waiting: list[_Call] = []
        self._count = threading.Lock()
        """Guards the counters alone: reading them never waits for a generate call to end."""
        self.busy_seconds = 0.0
        self.batches = 0
        self.rows = 0
        """Engine batches run, and the requests they held."""
        self._reused_seen = engine.kv_reused_tokens

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        call = _Call(list(requests), params)
        with self._cond:
            self._waiting.append(call)
        try:
            self._until_done(call)
        except BaseException:  # interrupted waiting, or running another call's batch
            with self._cond:
                if call in self._waiting:  # nobody else runs it for a caller that has gone
                    self._waiting.remove(call)
            raise
        if call.error is not None:
            raise call.error
        assert call.results is not None
        return call.results

    def _until_done(self, call: _Call) -> None:
        """Wait for ``call`` to be answered, running the next batch whenever the engine is free
        (a batch that may hold other callers' calls, and not this one)."""
        while True:
            with self._cond:
                while not call.done and self._running:
                    self._cond.wait()
                if call.done:
                    return
                batch = self._take()
                self._running = True
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def _take(self) -> list[_Call]:
        """The first waiting call and every other waiting call it may share a batch with (under
        the lock): out of the waiting list, in their order."""
        first = self._waiting[0]
        if first.params.seed is not None:
            batch = [first]
        else:
            batch = [c for c in self._waiting if c.params == first.params]
        self._waiting = [c for c in self._waiting if c not in batch]
        return batch

    def _run(self, batch: list[_Call]) -> None:
        """One engine batch of the calls' requests, each call's results (or the error) on it;
        a failed batch of several calls runs each call alone."""
        try:
            results = self._timed([r for c in batch for r in c.requests], batch[0].params)
        except Exception as error:
            if len(batch) == 1:
                batch[0].error, batch[0].done = error, True
            else:
                try:
                    for call in batch:
                        self._run([call])
                finally:  # an interrupt part-way: the calls not rerun yet get the batch's error
                    for call in batch:
                        if not call.done:
                            call.error, call.done = error, True
            return
        except BaseException as error:  # an interrupt: every call of the batch gets it
            for call in batch:
                call.error, call.done = error, True
            raise
        start = 0
        for call in batch:
            call.results, call.done = results[start : start + len(call.requests)], True
            start += len(call.requests)

    def _timed(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        started = time.perf_counter()
        try:
            results = list(self._engine.generate(requests, params))
        finally:
            with self._count:
                self.busy_seconds += time.perf_counter() - started
                self.batches += 1
                self.rows += len(requests)
        if len(results) != len(requests):
            raise RuntimeError(f"the engine answered {len(results)} results to {len(requests)} requests")
        return results

    def pop_counts(self) -> dict[str, float]:
        """Seconds generating, engine batches, their requests and the context tokens kept keys
        and values spared since the last call (a batch in flight counts once it ends)."""
        with self._count:
            reused = self._engine.kv_reused_tokens
            counts = {
                "busy_seconds": self.busy_seconds,
                "engine_batches": float(self.batches),
                "engine_rows": float(self.rows),
                "kv_reused_tokens": float(reused - self._reused_seen),
            }
            self.busy_seconds, self.batches, self.rows, self._reused_seen = 0.0, 0, 0, reused
        return counts
