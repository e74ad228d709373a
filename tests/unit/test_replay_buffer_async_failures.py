"""The async replay buffer under a rollout that keeps failing: it goes on retrying or
refilling, and the sample timeout that finally stops the run says that rollout kept failing."""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.replay_buffer_async import ReplayBufferAsync, SampleTimeoutError
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2


class BrokenReplica:
    """The rollout edge with a broken engine: every queued group fails at once, as the real
    worker tags it (running, then failure)."""

    def __init__(self, tq: TransferQueue) -> None:
        self.tq = tq
        self.queued: list[str] = []

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        self.queued.extend(keys)
        self.tq.set_tags(partition, {k: {"status": "running"} for k in keys})
        self.tq.set_tags(partition, {k: {"status": "failure"} for k in keys})


def make(**replay: Any) -> tuple[ReplayBufferAsync, TransferQueue, BrokenReplica]:
    tq = TransferQueue()
    replica = BrokenReplica(tq)
    prompts = [{"prompt": f"q{i}", "data_source": "d", "ground_truth": "0"} for i in range(100)]
    config = ReplayConfig(prefetch_batches=0, sample_timeout_seconds=0.2, **replay)
    return ReplayBufferAsync(tq, [replica], PromptLoader(prompts), N, {}, config), tq, replica


@pytest.mark.parametrize(("refill", "action"), [(False, "retried"), (True, "refilled")])
def test_a_rollout_that_keeps_failing_is_retried_then_named_in_the_timeout(refill: bool, action: str) -> None:
    buffer, tq, replica = make(refill_failed_groups=refill)
    buffer.dispatch(1, step=1)
    with pytest.raises(SampleTimeoutError) as info:
        buffer.sample(1, step=1)
    failures = len(replica.queued) - 1  # every failure was queued again (or replaced) at once
    assert failures >= 2
    assert str(info.value).startswith("replay buffer: 0 of 1 groups ready after")
    assert f"; {failures} group(s) failed meanwhile and were {action}" in str(info.value)
    metrics = buffer.pop_metrics()
    counted = metrics["replay/evicted_failure"] if refill else metrics["replay/retried_failure"]
    assert counted == failures
    if refill:
        assert len(set(replica.queued)) == len(replica.queued)  # a fresh prompt each time
    else:
        assert set(replica.queued) == {"p0"}


def test_a_timeout_without_failures_does_not_blame_rollout() -> None:
    buffer, tq, replica = make()
    replica.enqueue = lambda *args: None  # type: ignore[method-assign]  # slow, not failing
    buffer.dispatch(1, step=1)
    with pytest.raises(SampleTimeoutError) as info:
        buffer.sample(1, step=1)
    assert "failed meanwhile" not in str(info.value)
