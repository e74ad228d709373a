"""The replica's background generation: queued groups spread over the batches in flight."""

from __future__ import annotations

import threading
import time
from typing import Any

from rl_train.engines.workers.generation_loop import GenerationLoop


class Recorder:
    """A batch run that records its keys and holds until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
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
