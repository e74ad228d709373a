"""Streaming scores (``reward.streaming``) without Ray: the reward worker's scoring queue, the
async buffer sampling scored groups only, and the queue's late writes that never create records."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rl_train.engines.workers.reward_stream import ScoringQueue
from rl_train.storage.dataset import PromptLoader
from rl_train.storage.replay_buffer_async import ReplayBufferAsync, SampleTimeoutError
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2


def _wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


class GatedScoring:
    """The edge: a ``score_groups`` that records its calls and blocks until the test opens it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, partition: str, groups: list[str], n: int) -> int:
        self.calls.append(list(groups))
        self.started.set()
        assert self.gate.wait(10.0)
        return len(groups)


def test_a_group_queued_or_being_scored_is_not_queued_twice() -> None:
    scoring = GatedScoring()
    stream = ScoringQueue(scoring)
    assert stream.submit("train", ["p0"], N) == 1
    assert scoring.started.wait(10.0)  # p0 is being scored now
    assert stream.submit("train", ["p0", "p1", "p2"], N) == 2  # p0 ignored: it is being scored
    assert stream.submit("train", ["p1"], N) == 0  # queued already
    assert stream.pending() == 3
    scoring.gate.set()
    _wait_for(lambda: stream.pending() == 0)
    assert scoring.calls == [["p0"], ["p1", "p2"]]  # the queued ones in one batch
    assert stream.scored_groups == 3


def test_claim_takes_queued_groups_out_and_waits_for_the_one_being_scored() -> None:
    scoring = GatedScoring()
    stream = ScoringQueue(scoring)
    stream.submit("train", ["p0"], N)
    assert scoring.started.wait(10.0)
    stream.submit("train", ["p1", "p2"], N)  # queued behind p0
    claimed = threading.Event()

    def claim() -> None:
        stream.claim("train", ["p0", "p1"])
        claimed.set()

    thread = threading.Thread(target=claim)
    thread.start()
    assert not claimed.wait(0.2)  # p0 is still being scored: the claim waits for its write
    scoring.gate.set()
    thread.join(10.0)
    assert claimed.is_set()
    _wait_for(lambda: stream.pending() == 0)
    assert scoring.calls == [["p0"], ["p2"]]  # p1 was claimed: the caller scores it, once


def test_a_failed_background_scoring_leaves_the_group_to_be_handed_again() -> None:
    calls: list[list[str]] = []

    def failing_once(partition: str, groups: list[str], n: int) -> int:
        calls.append(groups)
        if len(calls) == 1:
            raise RuntimeError("grader unreachable")
        return len(groups)

    stream = ScoringQueue(failing_once)
    stream.submit("train", ["p0"], N)
    _wait_for(lambda: stream.pending() == 0 and len(calls) == 1)
    assert stream.scored_groups == 0
    assert stream.submit("train", ["p0"], N) == 1  # handed again: not held as queued
    _wait_for(lambda: stream.scored_groups == 1)


def test_late_scores_never_create_the_records_of_an_evicted_group() -> None:
    tq = TransferQueue()
    tq.put(
        "train",
        {"p0": {"prompt": "q"}, "p0/0": {"group_id": "p0"}},
        {"p0": {"kind": "prompt", "status": "pending"}},
    )
    updated = tq.update(
        "train",
        {"p0/0": {"reward": 1.0}, "p9/0": {"reward": 1.0}},
        {"p0": {"scored": True}, "p9": {"scored": True}},
    )
    assert updated == ["p0/0"]
    assert tq.get("train", ["p0/0"]) == [{"group_id": "p0", "reward": 1.0}]
    assert tq.query("train", scored=True) == ["p0"] and tq.count("train") == 2  # no p9 record, no p9 tag


# -- the async buffer, streaming ---------------------------------------------------------
class Replica:
    def __init__(self) -> None:
        self.queued: list[str] = []

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        self.queued.extend(keys)


class RecordingScorer:
    """A reward worker as the buffer sees it: records what it is handed (the edge of the world)."""

    def __init__(self) -> None:
        self.submitted: list[list[str]] = []

    def score(self, partition: str, keys: list[str]) -> list[object]:
        raise AssertionError("the streaming buffer scores nothing itself")

    def submit(self, partition: str, groups: list[str], n: int) -> None:
        assert partition == "train" and n == N
        self.submitted.append(list(groups))


def _finish(tq: TransferQueue, group: str, scored: bool) -> None:
    records = {f"{group}/{j}": {"group_id": group, "reward": float(j)} for j in range(N)}
    tags = {k: {"kind": "trajectory", "status": "eos", "group_id": group, "version": 0} for k in records}
    tq.put("train", records, tags)
    tq.set_tags("train", {group: {"status": "running"}})
    tq.set_tags("train", {group: {"status": "finished", **({"scored": True} if scored else {})}})


def _streaming_buffer() -> tuple[ReplayBufferAsync, TransferQueue, RecordingScorer]:
    tq, scorer = TransferQueue(), RecordingScorer()
    prompts = [{"prompt": f"q{i}", "data_source": "d", "ground_truth": "0"} for i in range(50)]
    config = ReplayConfig(prefetch_batches=0, sample_timeout_seconds=0.2, poll_interval_seconds=0.01)
    buffer = ReplayBufferAsync(tq, [Replica()], PromptLoader(prompts), N, {}, config, rewards=[scorer])
    buffer.streaming = True
    return buffer, tq, scorer


def test_a_finished_group_is_sampled_only_once_its_scores_are_in() -> None:
    buffer, tq, scorer = _streaming_buffer()
    buffer.dispatch(2, step=1)
    _finish(tq, "p0", scored=True)
    _finish(tq, "p1", scored=False)  # finished, its scores still on their way
    with pytest.raises(SampleTimeoutError, match="1 of 2 groups ready"):
        buffer.sample(2, step=1)
    assert scorer.submitted == [["p1"]]  # handed again once, at the first scan (a resumed run's)
    tq.set_tags("train", {"p1": {"scored": True}})  # the reward worker's write lands
    batch = buffer.sample(2, step=1)
    assert tq.get_batch(batch)["groups"] == ["p0", "p1"]
    metrics = buffer.pop_metrics()
    assert metrics["replay/awaiting_scores_max"] == 1 and metrics["replay/handed_again"] == 1


def test_a_group_left_unscored_is_handed_again_at_each_liveness_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rl_train.storage.replay_buffer_async as module

    monkeypatch.setattr(module, "LIVENESS_CHECK_SECONDS", 0.05)
    buffer, tq, scorer = _streaming_buffer()
    buffer.cfg.sample_timeout_seconds = 0.3
    buffer.dispatch(1, step=1)
    _finish(tq, "p0", scored=False)  # its worker died with it queued: no score ever comes
    with pytest.raises(SampleTimeoutError):
        buffer.sample(1, step=1)
    assert len(scorer.submitted) >= 3 and all(s == ["p0"] for s in scorer.submitted)


def test_without_streaming_a_finished_group_is_sampled_as_before() -> None:
    buffer, tq, scorer = _streaming_buffer()
    buffer.streaming = False
    buffer.dispatch(1, step=1)
    _finish(tq, "p0", scored=False)  # the reward phase scores it
    assert tq.get_batch(buffer.sample(1, step=1))["groups"] == ["p0"]
    assert scorer.submitted == [] and "replay/awaiting_scores_max" not in buffer.pop_metrics()


def test_groups_waiting_for_their_scores_free_their_rollout_slots_up_to_the_target() -> None:
    buffer, tq, _ = _streaming_buffer()
    buffer.cfg.awaiting_scores_multiple = 1
    buffer.dispatch(2, step=1)  # target 2 (no prefetch): p0, p1
    for group in ("p0", "p1"):
        _finish(tq, group, scored=False)  # both finished, their grader late
    with pytest.raises(SampleTimeoutError):
        buffer.sample(2, step=1)
    # rollout was given two more groups while the scores lagged, not left idle; never more than
    # the target again (a grader that never answers does not grow the queue without bound)
    assert tq.query("train", kind="prompt") == ["p0", "p1", "p2", "p3"]
    for group in ("p2", "p3"):
        _finish(tq, group, scored=False)
    with pytest.raises(SampleTimeoutError):
        buffer.sample(2, step=1)
    assert len(tq.query("train", kind="prompt")) == 4


@pytest.mark.parametrize(("multiple", "outstanding"), [(0, 2), (2, 6)])
def test_rollout_runs_ahead_of_late_scores_by_the_awaiting_multiple(multiple: int, outstanding: int) -> None:
    buffer, tq, _ = _streaming_buffer()
    buffer.cfg.awaiting_scores_multiple = multiple
    buffer.dispatch(2, step=1)  # target 2
    done: set[str] = set()
    for _ in range(3):  # every group drawn so far finishes, its grader late each time
        for group in set(tq.query("train", kind="prompt")) - done:
            _finish(tq, group, scored=False)
            done.add(group)
        with pytest.raises(SampleTimeoutError):
            buffer.sample(2, step=1)
    # 0: the late groups hold their slots; 2: up to 2 targets of them wait beside a full target
    assert len(tq.query("train", kind="prompt")) == outstanding


def test_groups_scored_late_keep_their_slots_free_until_sampled() -> None:
    """A grader answers a batch of late groups at once: rollout keeps its target of fresh
    groups beside that burst while the trainer works through it, rather than idle."""
    buffer, tq, _ = _streaming_buffer()
    buffer.cfg.awaiting_scores_multiple = 2
    buffer.dispatch(2, step=1)  # target 2: p0, p1
    late = ["p0", "p1", "p2", "p3", "p4", "p5"]
    for pair in (late[:2], late[2:4], late[4:]):  # each pair finishes, its grader late
        for group in pair:
            _finish(tq, group, scored=False)
        with pytest.raises(SampleTimeoutError):
            buffer.sample(2, step=1)
    assert tq.query("train", kind="prompt") == late  # 2 targets of late groups beside a target
    tq.set_tags("train", {g: {"scored": True} for g in late})  # the grader's burst lands
    batch = buffer.sample(2, step=1)
    assert tq.get_batch(batch)["groups"] == ["p0", "p1"]
    buffer.release(batch)
    # p2-p5, scored late and not sampled yet, hold no slot: rollout is given a target of fresh
    # groups (p6, p7) while the trainer works through them; were they to hold their slots,
    # rollout would idle for two steps
    buffer.dispatch(2, step=2)
    assert tq.query("train", kind="prompt") == [*late[2:], "p6", "p7"]
    for step, pair in ((2, late[2:4]), (3, late[4:])):
        batch = buffer.sample(2, step=step)
        assert tq.get_batch(batch)["groups"] == pair
        buffer.release(batch)
    buffer.dispatch(2, step=4)  # no late group left: the target alone
    assert tq.query("train", kind="prompt") == ["p6", "p7"]
