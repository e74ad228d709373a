"""One checkpoint write at a time, off the training thread, with no error lost.

Training snapshots its state (fast, in memory) and hands the slow part, writing the files and
committing, to ``BackgroundWriter``. Two writes of one run must never overlap: the newer one
could commit and prune while the older one is still writing into a folder that prune then
considers torn. So ``submit`` first waits for the previous write. A write's error is kept and
raised by the next ``submit`` or ``wait``, so that a run never believes a failed checkpoint
was saved.

The thread is a daemon: a process that dies mid-write leaves a step folder without a manifest,
which readers skip and a later prune removes; that is what the manifest-last commit is for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class BackgroundWriter:
    """Single-flight background writes for one run."""

    def __init__(self, name: str = "checkpoint-writer") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, fn: Callable[[], Any]) -> None:
        """Wait for the previous write (raising its error, in which case ``fn`` does not run),
        then run ``fn`` on a daemon thread."""
        self.wait()
        thread = threading.Thread(target=self._run, args=(fn,), name=self.name, daemon=True)
        self._thread = thread
        thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as error:  # kept for the caller: a daemon thread has no one to tell
            self._error = error

    def wait(self) -> None:
        """Block until the current write ends; raise its error (once) if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self) -> bool:
        """Whether a write is running now."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Wait for the last write; raise its error if it failed."""
        self.wait()
