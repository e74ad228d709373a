"""Which phase failures are retried (R-10.2): transient errors only, and only on the phases
whose second try cannot change the first one's result."""

from __future__ import annotations

import pytest
import ray

from rl_train import tasks
from rl_train.engines.workers.errors import is_transient
from rl_train.tasks.retry import RETRIES, call_with_retries


def test_transient_errors_are_told_apart_from_bugs() -> None:
    assert is_transient(TimeoutError("slow sandbox"))
    assert is_transient(ConnectionResetError("reward server went away"))
    assert is_transient(ray.exceptions.RayActorError())
    wrapped = RuntimeError("while scoring")
    wrapped.__cause__ = ray.exceptions.GetTimeoutError("get timed out")
    assert is_transient(wrapped)
    assert not is_transient(KeyError("record lacks field 'advantages'"))
    assert not is_transient(ValueError("bad config"))


def test_a_transient_failure_is_retried_with_backoff_and_a_bug_is_not() -> None:
    calls, sleeps = [], []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise TimeoutError("sandbox timed out")
        return x * 2

    assert call_with_retries(flaky, (21,), RETRIES, sleep=sleeps.append) == 42
    assert len(calls) == 3 and sleeps == sorted(sleeps) and len(sleeps) == 2

    def buggy() -> None:
        calls.append(0)
        raise KeyError("missing")

    calls.clear()
    with pytest.raises(KeyError):
        call_with_retries(buggy, (), RETRIES, sleep=sleeps.append)
    assert len(calls) == 1


def test_only_idempotent_phases_retry() -> None:
    every = (*tasks.PHASES, *tasks.CRITIC_PHASES, *tasks.GREEDY_BASELINE_PHASES)
    retried = {name for name in every if getattr(tasks, name).retries}
    assert retried == {"reward", "balance", "old_log_prob", "ref", "values"}
    for name in ("update", "advantage", "weight_sync", "critic_update", "generate"):
        assert getattr(tasks, name).retries == 0, name
