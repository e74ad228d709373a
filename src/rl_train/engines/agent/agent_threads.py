"""In-process agents (``rollout.agent.gateway_mode: in_process``): a function on a daemon thread.

A thread cannot be killed. The supervisor (``gateway_runs``) therefore never joins one: at the
deadline it closes the agent's session (its further requests get 410, so it can do no more
harm to the trajectory or the engine) and abandons the thread, which goes on until its
function returns, if ever. Abandoned threads still alive are counted; past
``MAX_STUCK_THREADS`` no new in-process agent starts (each refused one fails its own prompt,
with a warning), since every stuck thread may hold memory, sockets or a CPU for good. Only
trusted code should run this way: it shares the trainer's memory, credentials and files.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

Program = Callable[[str, str, str], Any]
"""f(base_url, api_key, task), the agent as a function."""

MAX_STUCK_THREADS = 8
"""Abandoned agent threads still running beyond which in-process agents are refused."""

_STUCK: set[threading.Thread] = set()
_STUCK_LOCK = threading.Lock()


def load_program(spec: str) -> Program:
    """The function ``module:function`` names (``rollout.agent.gateway_program``)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"rollout.agent.gateway_program: got {spec!r}; expected module:function")
    program: Program = getattr(importlib.import_module(module), name)
    return program


def stuck_threads() -> int:
    """Abandoned agent threads that are still running."""
    with _STUCK_LOCK:
        for thread in [t for t in _STUCK if not t.is_alive()]:
            _STUCK.discard(thread)
        return len(_STUCK)


class StuckThreadsError(RuntimeError):
    """Too many abandoned agent threads are still running to start another."""


class AgentThread:
    """One in-process agent: ``program(base_url, api_key, task)`` on a daemon thread."""

    def __init__(self, program: Program, base_url: str, api_key: str, task: str, name: str) -> None:
        stuck = stuck_threads()
        if stuck >= MAX_STUCK_THREADS:
            raise StuckThreadsError(
                f"{stuck} in-process agents that overran their deadline are still running (at most "
                f"{MAX_STUCK_THREADS}); no new one starts until they end. Run agents as processes "
                "(rollout.agent.gateway_mode: process), which are killed at the deadline"
            )
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(program, base_url, api_key, task), name=name, daemon=True)
        self._thread.start()

    def _run(self, program: Program, base_url: str, api_key: str, task: str) -> None:
        try:
            program(base_url, api_key, task)
        except BaseException as error:  # the agent's failure, reported by the supervisor
            self.error = error
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def abandon(self) -> None:
        """Stop waiting for it; counted as stuck while it still runs."""
        if self._thread.is_alive():
            with _STUCK_LOCK:
                _STUCK.add(self._thread)
