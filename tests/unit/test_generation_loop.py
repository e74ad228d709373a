"""The replica's background generation: queued groups spread over the batches in flight, and
what a pause (the engine only) and a hold (everything) stop."""

from __future__ import annotations

import threading
import time
from typing import Any

from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.workers.generation_loop import GatedEngine, GenerationLoop


class Recorder:
    """A batch run that records its keys and holds until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, partition: str, keys: list[str], n: int, params: dict[str, Any], more: Any = None) -> list[str]:
        with self.lock:
            self.batches.append(list(keys))
        self.release.wait(10)
        return []


def _batches(batches_in_flight: int, groups: int, wait_for: int) -> list[list[str]]:
    run = Recorder()
    loop = GenerationLoop(run, abort=lambda: None, batches_in_flight=batches_in_flight)
    loop.enqueue("train", [f"g{i}" for i in range(groups)], 8, {"temperature": 1.0})
    deadline = time.monotonic() + 5
    while len(run.batches) < wait_for and time.monotonic() < deadline:
        time.sleep(0.005)
    run.release.set()
    deadline = time.monotonic() + 5
    while loop.queued() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    return run.batches


def test_one_batch_in_flight_takes_the_queue_whole() -> None:
    batches = _batches(1, 32, 1)
    assert batches == [[f"g{i}" for i in range(32)]]


def test_queued_groups_are_shared_among_the_batches_in_flight() -> None:
    batches = _batches(4, 32, 4)
    assert sorted(len(b) for b in batches) == [8, 8, 8, 8]
    assert sorted(k for b in batches for k in b) == sorted(f"g{i}" for i in range(32))


def test_a_share_never_passes_the_most_groups_a_batch_takes() -> None:
    batches = _batches(2, 200, 2)
    assert max(len(b) for b in batches) == 64
    assert sum(len(b) for b in batches) == 200


class Engine:
    """An engine whose batch runs until aborted (or ``finish`` is set); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.aborted = threading.Event()
        self.finish = threading.Event()

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.calls += 1
        while not (self.aborted.is_set() or self.finish.is_set()):
            time.sleep(0.002)
        reason = "aborted" if self.aborted.is_set() else "eos"
        self.aborted.clear()
        return [GenerationResult(r.request_id, r.prompt_ids, [*r.response_prefix, 7], [-1.0], [0], reason) for r in requests]


def _call(engine: Any, out: list[Any]) -> threading.Thread:
    request = GenerationRequest("a/0", [1], [5])
    thread = threading.Thread(target=lambda: out.append(engine.generate([request], SamplingParams())), daemon=True)
    thread.start()
    return thread


def test_a_pause_stops_the_engine_and_keeps_background_calls_out_until_resumed() -> None:
    engine = Engine()
    loop = GenerationLoop(lambda *a: [], abort=engine.aborted.set)
    gated = GatedEngine(engine, loop)
    first: list[Any] = []
    running = _call(gated, first)
    while not engine.calls:
        time.sleep(0.002)
    loop.pause()  # returns once the running call has been aborted out of the engine
    running.join(2)
    assert first[0][0].stop_reason == "aborted" and first[0][0].response_ids == [5, 7]
    second: list[Any] = []
    waiting = _call(gated, second)
    time.sleep(0.1)
    assert engine.calls == 1 and not second  # held at the gate, not in the engine
    engine.finish.set()
    assert engine.generate([GenerationRequest("v", [1])], SamplingParams())[0].stop_reason == "eos"
    assert engine.calls == 2  # a blocking caller (validation) calls the engine itself: never held
    loop.resume()
    waiting.join(2)
    assert engine.calls == 3 and second[0][0].stop_reason == "eos"


def test_a_hold_while_paused_returns_the_waiting_calls_aborted_without_the_engine() -> None:
    engine = Engine()
    loop = GenerationLoop(lambda *a: [], abort=engine.aborted.set)
    gated = GatedEngine(engine, loop)
    loop.pause()
    out: list[Any] = []
    waiting = _call(gated, out)
    time.sleep(0.05)
    loop.hold()
    waiting.join(2)
    assert engine.calls == 0
    assert out[0][0].stop_reason == "aborted" and out[0][0].response_ids == [5]  # as it came


def test_no_batch_starts_while_paused() -> None:
    run = Recorder()
    run.release.set()
    loop = GenerationLoop(run, abort=lambda: None)
    loop.pause()
    loop.enqueue("train", ["g0", "g1"], 8, {})
    time.sleep(0.1)
    assert run.batches == [] and loop.queued() == 2
    loop.resume()
    deadline = time.monotonic() + 2
    while loop.queued() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert run.batches == [["g0", "g1"]]


def test_a_running_batch_takes_more_queued_groups_of_its_kind() -> None:
    """``more`` hands a running batch queued groups of its own job, up to what it asks for,
    none while paused, and no more than its life's share."""
    taken: list[list[str]] = []
    started, go = threading.Event(), threading.Event()

    def run(partition: str, keys: list[str], n: int, params: dict[str, Any], more: Any) -> list[str]:
        started.set()
        assert go.wait(5)
        taken.append(more(3))  # three of the four queued "train" groups; never the "val" one
        loop.pause()
        taken.append(more(3))  # none while paused
        loop.resume()
        taken.append(more(1000))  # the rest, within the batch's life
        return []

    loop = GenerationLoop(run, abort=lambda: None, max_groups_per_batch=2)
    loop.enqueue("train", ["g0"], 8, {})
    assert started.wait(5)
    loop.enqueue("val", ["v0"], 1, {})
    loop.enqueue("train", ["g1", "g2", "g3", "g4"], 8, {})
    loop.enqueue("train", [f"h{i}" for i in range(10)], 8, {})
    go.set()
    deadline = time.monotonic() + 5
    while len(taken) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert taken[0] == ["g1", "g2"]  # at most max_groups_per_batch at a time, whatever it asks
    assert taken[1] == []
    assert taken[2] == ["g3", "g4"]
    # over its life a batch takes ADMIT_LIFETIME x max_groups_per_batch: 1 + 2 + 2 + 2 = 7 < 8
    assert len(loop._more(("train", 8, ()), [8], 5)) == 0
