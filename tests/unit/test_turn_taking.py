"""A replica's loops share its engine: their calls take turns, the calls that wait meanwhile
share the next engine batch, and the engine's busy seconds, batches and requests are counted
for the step's rollout metrics."""

from __future__ import annotations

import threading
import time

import pytest

from rl_train.engines.rollout.protocol import SamplingParams
from rl_train.engines.workers.turn_taking import TurnTakingEngine

GREEDY = SamplingParams(0.0, 1.0, 4)


class CountingEngine:
    kv_reused_tokens = 0
    """An engine that keeps no keys and values between turns."""

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
    assert 1 <= counts["engine_batches"] <= 18 and counts["engine_rows"] == 36
    assert counts["busy_seconds"] >= counts["engine_batches"] * 0.002
    assert counts["kv_reused_tokens"] == 0.0  # an engine that keeps nothing between turns
    assert turns.pop_counts() == {"busy_seconds": 0.0, "engine_batches": 0.0, "engine_rows": 0.0, "kv_reused_tokens": 0.0}
    assert turns.abort() == "aborted"  # the rest of the engine shows through


def test_the_context_kept_keys_spared_is_counted_since_the_last_pop() -> None:
    engine = CountingEngine()
    engine.kv_reused_tokens = 40
    turns = TurnTakingEngine(engine)  # what was reused before it wrapped the engine is not this step's
    engine.kv_reused_tokens += 25
    assert turns.pop_counts()["kv_reused_tokens"] == 25
    engine.kv_reused_tokens += 5
    assert turns.pop_counts()["kv_reused_tokens"] == 5 and turns.pop_counts()["kv_reused_tokens"] == 0


def test_a_failed_call_still_counts_and_frees_the_engine() -> None:
    class Failing:
        kv_reused_tokens = 0

        def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
            raise RuntimeError("engine down")

    turns = TurnTakingEngine(Failing())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="engine down"):
            turns.generate(["a"], GREEDY)
    assert turns.pop_counts()["engine_batches"] == 2


class GatedEngine:
    """Holds its first batch until ``release`` is set; records every batch it ran."""

    kv_reused_tokens = 0

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.started = threading.Event()

    def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
        self.batches.append(list(requests))
        self.started.set()
        self.release.wait(10)
        if "bad" in requests:
            raise ValueError("bad request")
        return [f"{r}:{params.max_new_tokens}" for r in requests]


def _calls_while_the_engine_is_held(engine: GatedEngine, calls: list[tuple[list[str], SamplingParams]]) -> list[object]:
    """The first call runs (and is held) while the others arrive; each call's result or error."""
    turns = TurnTakingEngine(engine)
    out: list[object] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            out[i] = turns.generate(*calls[i])
        except ValueError as error:
            out[i] = error

    threads = [threading.Thread(target=one, args=(0,))]
    threads[0].start()
    assert engine.started.wait(5)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    deadline = time.monotonic() + 5
    while len(turns._waiting) < len(calls) - 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    engine.release.set()
    for thread in threads:
        thread.join(10)
    return out


def test_calls_that_wait_share_the_next_engine_batch() -> None:
    engine = GatedEngine()
    out = _calls_while_the_engine_is_held(engine, [(["a"], GREEDY), (["b", "c"], GREEDY), (["d"], GREEDY)])
    assert out == [["a:4"], ["b:4", "c:4"], ["d:4"]]
    assert engine.batches == [["a"], ["b", "c", "d"]]


def test_other_parameters_and_seeded_calls_get_batches_of_their_own() -> None:
    engine = GatedEngine()
    longer, seeded = SamplingParams(0.0, 1.0, 9), SamplingParams(0.0, 1.0, 4, seed=7)
    calls = [(["a"], GREEDY), (["b"], longer), (["c"], GREEDY), (["s1"], seeded), (["s2"], seeded), (["e"], longer)]
    out = _calls_while_the_engine_is_held(engine, calls)
    assert out == [["a:4"], ["b:9"], ["c:4"], ["s1:4"], ["s2:4"], ["e:9"]]
    assert engine.batches[0] == ["a"]
    assert sorted(map(sorted, engine.batches[1:])) == [["b", "e"], ["c"], ["s1"], ["s2"]]


def test_a_bad_request_fails_its_own_call_only() -> None:
    engine = GatedEngine()
    out = _calls_while_the_engine_is_held(engine, [(["a"], GREEDY), (["b"], GREEDY), (["bad"], GREEDY), (["d"], GREEDY)])
    assert out[0] == ["a:4"] and out[1] == ["b:4"] and out[3] == ["d:4"]
    assert isinstance(out[2], ValueError)
    assert engine.batches == [["a"], ["b", "bad", "d"], ["b"], ["bad"], ["d"]]  # the merged batch, then each alone


def test_an_engine_that_answers_the_wrong_count_fails_the_call() -> None:
    class Short:
        kv_reused_tokens = 0

        def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
            return requests[:-1]

    with pytest.raises(RuntimeError, match="1 results to 2 requests"):
        TurnTakingEngine(Short()).generate(["a", "b"], GREEDY)


class _Stop(BaseException):
    """An interrupt (not an ``Exception``): never retried call by call."""


def test_an_interrupt_reaches_its_batch_and_leaves_no_call_behind() -> None:
    class Interrupting(GatedEngine):
        def generate(self, requests: list[str], params: SamplingParams) -> list[str]:
            if "boom" in requests:
                raise _Stop()
            return super().generate(requests, params)

    engine = Interrupting()
    turns = TurnTakingEngine(engine)
    out: dict[str, object] = {}

    def one(name: str, params: SamplingParams) -> None:
        try:
            out[name] = turns.generate([name], params)
        except _Stop as stop:
            out[name] = stop

    first = threading.Thread(target=one, args=("a", GREEDY))
    first.start()
    assert engine.started.wait(5)
    others = [threading.Thread(target=one, args=(n, p)) for n, p in (("boom", GREEDY), ("x", SamplingParams(0.0, 1.0, 9)))]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 5
    while len(turns._waiting) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    engine.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert out["a"] == ["a:4"] and isinstance(out["boom"], _Stop)
    assert out["x"] == ["x:9"] or isinstance(out["x"], _Stop)  # the boom batch may have run on x's thread
    assert turns._waiting == [] and not turns._running
