"""A rollout replica's engine as its agent loops see it: one engine, several loops at once.

With ``rollout.agent.batches_in_flight`` above 1 several agent loops share the replica's
engine; their generate calls take turns (one engine batch at a time). The time spent
generating is counted as the replica's busy time, with the engine batches run and the
requests they held: a multi-turn loop generates the next turn of whichever trajectories' tool
calls have answered, so its batches are often small, and ``rollout/rows_per_engine_batch``
shows how small. ``rollout/kv_reused_tokens`` counts the context tokens that kept keys and
values spared the engine prefilling again (the built-in engine; 0 for one that keeps none).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rl_train.engines.rollout.protocol import SamplingParams


class TurnTakingEngine:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._turn = threading.Lock()
        self._count = threading.Lock()
        """Guards the counters alone: reading them never waits for a generate call to end."""
        self.busy_seconds = 0.0
        self.batches = 0
        self.rows = 0
        """Engine batches run, and the requests they held."""
        self._reused_seen = self._reused()

    def generate(self, requests: list[Any], params: SamplingParams) -> list[Any]:
        with self._turn:
            started = time.perf_counter()
            try:
                return self._engine.generate(requests, params)
            finally:
                with self._count:
                    self.busy_seconds += time.perf_counter() - started
                    self.batches += 1
                    self.rows += len(requests)

    def pop_counts(self) -> dict[str, float]:
        """Seconds generating, engine batches, their requests and the context tokens kept keys
        and values spared since the last call (a batch in flight counts once it ends)."""
        with self._count:
            reused = self._reused()
            counts = {
                "busy_seconds": self.busy_seconds,
                "engine_batches": float(self.batches),
                "engine_rows": float(self.rows),
                "kv_reused_tokens": float(reused - self._reused_seen),
            }
            self.busy_seconds, self.batches, self.rows, self._reused_seen = 0.0, 0, 0, reused
        return counts

    def _reused(self) -> int:
        kept = getattr(self._engine, "kept", None)
        return int(getattr(kept, "reused_tokens", 0))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
