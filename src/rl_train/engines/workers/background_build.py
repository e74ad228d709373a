"""Something a worker needs later, built on a thread now: ``start`` begins it, ``get`` waits.

A worker's heavy parts (an import of torch's compiler, the advantage phase, which imports
torch) need not delay the moment its pool is ready: the first batch is generated before they
are used. ``start`` is called once the pools are up (``QueuePool.warm_up``); ``get`` builds
on the spot if nothing started it, and re-raises what the build raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundBuild(Generic[T]):
    def __init__(self, build: Callable[[], T], name: str = "rl-train-warm-up") -> None:
        self._build = build
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._done:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._build()
        except BaseException as error:  # re-raised by get()
            self._error = error
        self._done = True

    def get(self) -> T:
        with self._lock:
            thread = self._thread
            if thread is None and not self._done:
                self._run()
        if thread is not None:
            thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
