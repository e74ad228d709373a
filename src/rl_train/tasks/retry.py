"""Which phases a failure may retry, and how (R-10.2).

A phase is retried only when a second try cannot change the result of the first: it reads
records and overwrites derived fields (rewards, log-probs, values, the balance), and the
error was transient (a worker that died and is being restarted, a timeout, a dropped
connection: ``is_transient``). The update and the advantage phase (an optimizer step, the
adaptive KL state) and the weight sync are never retried within a step: the unit of retry
for those is the run, which resumes from its newest checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from rl_train.engines.workers.errors import is_transient

P = ParamSpec("P")
R = TypeVar("R")

RETRIES = 2
RETRY_DELAYS_SECONDS = [1.0, 4.0]
"""Backoff between tries: long enough for Ray to restart a dead actor."""


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: retry only a transient error."""
    error = state.data if isinstance(state.data, BaseException) else None
    if error is None:
        try:
            state.result()
        except BaseException as exc:  # the state's own exception
            error = exc
    return error is not None and is_transient(error)


def phase_task(name: str) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A phase that is never retried within its step. Its results are keys and small dicts:
    nothing to cache or persist (Prefect stays cheap)."""
    return task(name=name, cache_policy=NO_CACHE, persist_result=False)


def retrying_phase_task(name: str) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A phase whose second try cannot change the first's result: retried on a transient error."""
    return task(
        name=name,
        cache_policy=NO_CACHE,
        persist_result=False,
        retries=RETRIES,
        retry_delay_seconds=RETRY_DELAYS_SECONDS,
        retry_condition_fn=retry_transient,
    )


def call_with_retries(fn: Callable[..., Any], args: tuple[Any, ...], retries: int, sleep: Callable[[float], None] = time.sleep) -> Any:
    """What Prefect does for a retrying task, for phases called directly (no Prefect)."""
    for attempt in range(retries + 1):
        try:
            return fn(*args)
        except Exception as exc:
            if attempt == retries or not is_transient(exc):
                raise
            sleep(RETRY_DELAYS_SECONDS[min(attempt, len(RETRY_DELAYS_SECONDS) - 1)])
    raise AssertionError("unreachable")
