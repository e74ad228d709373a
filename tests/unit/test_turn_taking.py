"""A replica's loops share its engine: their calls take turns, and the engine's busy seconds,
batches and requests are counted for the step's rollout metrics."""

from __future__ import annotations

import threading
import time

import pytest

from rl_train.engines.rollout.protocol import SamplingParams
from rl_train.engines.workers.turn_taking import TurnTakingEngine

GREEDY = SamplingParams(0.0, 1.0, 4)


class CountingEngine:
    def __init__(self) -> None:
        self.inside = 0
        self.most_inside = 0
        self.lock = threading.Lock()

    def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        time.sleep(0.002)
        with self.lock:
            self.inside -= 1
        return [r.upper() for r in requests]

    def abort(self) -> str:
        return "aborted"


def test_loops_take_turns_and_each_gets_its_own_results() -> None:
    engine = CountingEngine()
    turns = TurnTakingEngine(engine)
    results: dict[int, list[str]] = {}

    def loop(t: int) -> None:
        results[t] = [turns.generate([f"t{t}-{i}", f"t{t}-{i}b"], GREEDY)[0] for i in range(3)]

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {t: [f"T{t}-{i}" for i in range(3)] for t in range(6)}
    assert engine.most_inside == 1  # one engine batch at a time
    counts = turns.pop_counts()
    assert counts["engine_batches"] == 18 and counts["engine_rows"] == 36
    assert counts["busy_seconds"] >= 18 * 0.002
    assert counts["kv_reused_tokens"] == 0.0  # an engine that keeps nothing between turns
    assert turns.pop_counts() == {"busy_seconds": 0.0, "engine_batches": 0.0, "engine_rows": 0.0, "kv_reused_tokens": 0.0}
    assert turns.abort() == "aborted"  # the rest of the engine shows through


def test_the_context_kept_keys_spared_is_counted_since_the_last_pop() -> None:
    engine = CountingEngine()
    engine.kept = type("Kept", (), {"reused_tokens": 40})()  # type: ignore[attr-defined]
    turns = TurnTakingEngine(engine)  # what was reused before it wrapped the engine is not this step's
    engine.kept.reused_tokens += 25  # type: ignore[attr-defined]
    assert turns.pop_counts()["kv_reused_tokens"] == 25
    engine.kept.reused_tokens += 5  # type: ignore[attr-defined]
    assert turns.pop_counts()["kv_reused_tokens"] == 5 and turns.pop_counts()["kv_reused_tokens"] == 0


def test_a_failed_call_still_counts_and_frees_the_engine() -> None:
    class Failing:
        def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
            raise RuntimeError("engine down")

    turns = TurnTakingEngine(Failing())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="engine down"):
            turns.generate(["a"], GREEDY)
    assert turns.pop_counts()["engine_batches"] == 2
