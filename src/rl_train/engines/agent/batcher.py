"""Concurrent single requests gathered into engine batches (the gateway's sessions).

Each session's request blocks in ``generate`` while one thread takes every request waiting
with the same sampling parameters (up to ``max_batch``, after a ``window_s`` pause for more to
arrive) and runs them as one engine batch. Requests with other parameters wait for the next
batch. An engine error fails the requests of its batch, and the thread goes on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams


@dataclass(eq=False)
class _Pending:
    request: GenerationRequest
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: GenerationResult | None = None
    error: BaseException | None = None


class MicroBatcher:
    def __init__(self, engine: Any, window_s: float = 0.005, max_batch: int = 256) -> None:
        self.engine = engine
        self.window_s, self.max_batch = window_s, max_batch
        self._waiting: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gateway-batcher", daemon=True)
        self._thread.start()

    def generate(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        pending = _Pending(request, params)
        with self._cond:
            if self._closed:
                raise RuntimeError("the gateway's batcher is closed")
            self._waiting.append(pending)
            self._cond.notify_all()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _take(self) -> list[_Pending]:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed:
                return []
        time.sleep(self.window_s)  # let the other sessions of this round arrive
        with self._cond:
            params = self._waiting[0].params
            batch = [p for p in self._waiting if p.params == params][: self.max_batch]
            taken = {id(p) for p in batch}
            self._waiting = [p for p in self._waiting if id(p) not in taken]
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            try:
                results = self.engine.generate([p.request for p in batch], batch[0].params)
                for pending, result in zip(batch, results, strict=True):
                    pending.result = result
            except BaseException as error:  # each waiting request gets it
                for pending in batch:
                    pending.error = error
            for pending in batch:
                pending.done.set()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            self._cond.notify_all()
        for pending in waiting:
            pending.error = RuntimeError("the gateway closed")
            pending.done.set()
        self._thread.join(timeout=5)
