"""Simulated tool environments: the long tail of agentic rollouts, on any machine.

An agentic trajectory is not done when the model stops generating: its tool call (a
sandbox running the answer, a search, a test suite) still has to return, and those
latencies are heavy-tailed. ``rollout.tool_env`` puts such a call after every trajectory
of the ``train`` partition:

- ``none``: no tool call; a group is finished when its last trajectory is generated.
- ``long_tail_sandbox``: the answer is submitted to a simulated sandbox whose latency is
  lognormal (median ``latency_median_seconds``, shape ``latency_sigma``, so
  p99/p50 = exp(2.326 sigma): 20x at sigma 1.29). The reward stays the task's own rule,
  so learning is still verifiable.

A latency is a pure function of (seed, trajectory key): every trainer mode meets the same
tail on the same prompts, which is what makes mode-against-mode benchmarks fair. The calls
never busy-wait: ``DelayedCalls`` is one timer thread over a heap of deadlines, so a
thousand sandboxes in flight cost one sleeping thread. Generation does not wait for them:
the engine moves on to the next batch while the sandboxes run (R-5.1).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
import time
from collections.abc import Callable
from statistics import NormalDist

from pydantic import Field, field_validator

from rl_train.algorithms.config import StrictModel
from rl_train.registry import Entry, Registry

LatencyFn = Callable[[str], float]
"""trajectory key -> tool-call latency in seconds."""


class ToolEnvConfig(StrictModel):
    name: str = "none"
    """Registered tool environment: none (no tool call) or long_tail_sandbox (lognormal sandbox latency)."""
    latency_median_seconds: float = Field(0.2, gt=0)
    """long_tail_sandbox: median (p50) latency of one tool call."""
    latency_sigma: float = Field(1.4, ge=0)
    """long_tail_sandbox: lognormal shape; p99/p50 = exp(2.326 x sigma) (1.4 gives 26x)."""
    latency_max_seconds: float = Field(60.0, gt=0)
    """long_tail_sandbox: a call never takes longer than this (a sandbox timeout)."""
    seed: int = 0
    """Seed of the latency draws (each trajectory key always gets the same latency)."""

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        return TOOL_ENVS.check(name)

    def build(self) -> LatencyFn | None:
        """The latency function, or None when there is no tool call."""
        return TOOL_ENVS.get(self.name)(self)

    def quantile_seconds(self, q: float) -> float:
        """The ``q`` quantile of the configured lognormal latency (before the cap)."""
        return min(
            self.latency_median_seconds * math.exp(self.latency_sigma * NormalDist().inv_cdf(q)),
            self.latency_max_seconds,
        )


def no_tool(cfg: ToolEnvConfig) -> LatencyFn | None:
    """No tool call; a group is finished once its last trajectory is generated."""
    return None


def long_tail_sandbox(cfg: ToolEnvConfig) -> LatencyFn:
    """The answer goes to a simulated sandbox with lognormal latency (p50 `latency_median_seconds`,
    p99/p50 = exp(2.326 `latency_sigma`)); the group finishes when its slowest call returns."""
    mu = math.log(cfg.latency_median_seconds)

    def latency(key: str) -> float:
        draw = random.Random(f"{cfg.seed}:{key}").lognormvariate(mu, cfg.latency_sigma)
        return min(draw, cfg.latency_max_seconds)

    return latency


TOOL_ENVS: Registry[Entry[Callable[[ToolEnvConfig], LatencyFn | None]]] = Registry(
    "tool environment",
    "rollout.tool_env.name",
    {"none": Entry(no_tool), "long_tail_sandbox": Entry(long_tail_sandbox)},
)


class DelayedCalls:
    """Run callables at wall-clock deadlines on one timer thread (no polling, no busy-wait).

    A callable that raises is recorded in ``errors`` and the thread goes on.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def call_at(self, deadline: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` at ``deadline`` (``time.time()`` seconds; a past deadline runs at once)."""
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tool-calls", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pop_errors(self) -> list[str]:
        """The errors recorded since the last call."""
        with self._cond:
            errors, self.errors = self.errors, []
        return errors

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.time():
                    self._cond.wait(self._heap[0][0] - time.time() if self._heap else None)
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - reported through ``errors``, never lost
                with self._cond:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
