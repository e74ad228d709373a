"""Several background scorings at once (``reward.max_concurrent_batches``): a slow grader's
batches overlap, no group is scored twice, and a reward that does not declare itself
``concurrent`` is never entered by two threads at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.workers.reward_stream import ScoringQueue

N = 2
SLEEP = 0.5


def _wait_for(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


class SleepingScoring:
    """A ``score_groups`` that sleeps per batch and records who scored what, and how many at once."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def __call__(self, partition: str, groups: list[str], n: int) -> int:
        with self._lock:
            self.calls.append(list(groups))
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        time.sleep(SLEEP)
        with self._lock:
            self.inside -= 1
        return len(groups)


def _submit_one_at_a_time(stream: ScoringQueue, groups: list[str]) -> None:
    for group in groups:  # as rollout finishes them: each while the earlier ones are scored
        stream.submit("train", [group], N)
        time.sleep(0.02)


def test_batches_overlap_up_to_the_cap_and_no_group_is_scored_twice() -> None:
    scoring = SleepingScoring()
    stream = ScoringQueue(scoring, max_concurrent=4)
    started = time.monotonic()
    _submit_one_at_a_time(stream, ["p0", "p1", "p2", "p3"])
    stream.submit("train", ["p0", "p1", "p2", "p3"], N)  # handed again while being scored: ignored
    _wait_for(lambda: stream.pending() == 0)
    elapsed = time.monotonic() - started
    scored = [g for call in scoring.calls for g in call]
    assert sorted(scored) == ["p0", "p1", "p2", "p3"]  # each once
    assert scoring.most_inside > 1 and stream.scored_groups == 4
    assert elapsed < 4 * SLEEP  # about one sleep, not four (one batch at a time takes 2 s)


def test_one_batch_at_a_time_is_still_there() -> None:
    scoring = SleepingScoring()
    stream = ScoringQueue(scoring, max_concurrent=1)
    _submit_one_at_a_time(stream, ["p0", "p1", "p2"])
    _wait_for(lambda: stream.pending() == 0)
    assert scoring.most_inside == 1
    assert scoring.calls == [["p0"], ["p1", "p2"]]  # the ones queued meanwhile, in one batch


def test_a_claim_waits_for_every_batch_in_flight_that_holds_its_groups() -> None:
    scoring = SleepingScoring()
    stream = ScoringQueue(scoring, max_concurrent=4)
    _submit_one_at_a_time(stream, ["p0", "p1"])
    _wait_for(lambda: scoring.inside == 2)
    stream.claim("train", ["p0", "p1"])
    assert scoring.inside == 0 and sorted(g for c in scoring.calls for g in c) == ["p0", "p1"]


def test_the_cap_is_validated() -> None:
    with pytest.raises(ValidationError, match="max_concurrent_batches"):
        RewardConfig.model_validate({"max_concurrent_batches": 0})
    assert RewardConfig().max_concurrent_batches == 4
    with pytest.raises(ValueError, match=r"reward\.max_concurrent_batches: 0"):
        ScoringQueue(SleepingScoring(), max_concurrent=0)


class CountingReward:
    """A ``BatchReward`` that records how many threads are inside it at once."""

    concurrent = False
    inside = 0
    most_inside = 0
    lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: object) -> CountingReward:
        return cls()

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        cls = type(self)
        with cls.lock:
            cls.inside += 1
            cls.most_inside = max(cls.most_inside, cls.inside)
        time.sleep(0.1)
        with cls.lock:
            cls.inside -= 1
        return [RewardResult(1.0) for _ in trajectories]


class ConcurrentCountingReward(CountingReward):
    concurrent = True
    inside = 0
    most_inside = 0
    lock = threading.Lock()


def _most_inside(reward: type[CountingReward]) -> int:
    name = f"{__name__}:{reward.__name__}"
    router = RewardRouter(RewardConfig.model_validate({"default": name}))
    trajectory = Trajectory("q", "a", "a", "a", "d", "a")
    threads = [threading.Thread(target=router.score, args=([trajectory],)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20.0)
    return reward.most_inside


def test_a_reward_not_declared_concurrent_is_entered_by_one_thread_at_a_time() -> None:
    assert _most_inside(CountingReward) == 1


def test_a_reward_declared_concurrent_is_called_from_several_threads_at_once() -> None:
    assert _most_inside(ConcurrentCountingReward) > 1
