"""Reading a finished run's task runs back from Prefect's API in tests.

The server records task runs from the events their engines send, in the background: a read
right after the flow run has ended can miss the last few of them. ``recorded_task_names``
reads again until the names a test expects are there (or its deadline passes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId


def recorded_task_names(client: Any, flow_run_id: Any, expected: Iterable[str], timeout_s: float = 30.0) -> set[str]:
    """The phase names (``<name>-<n>`` without the counter) of the task runs of ``flow_run_id``,
    once they include ``expected`` or ``timeout_s`` has passed (the test's assertion then says
    what is missing)."""
    return recorded_task_run_names(client, flow_run_id, expected, timeout_s, lambda name: name.rsplit("-", 1)[0])


def recorded_task_run_names(
    client: Any,
    flow_run_id: Any,
    expected: Iterable[str],
    timeout_s: float = 30.0,
    key: Callable[[str], str] = lambda name: name,
) -> set[str]:
    """``key`` of each task run name of ``flow_run_id`` (whole names by default), once they
    include ``expected`` or ``timeout_s`` has passed."""
    wanted = set(expected)
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
        )
        names = {key(t.name) for t in tasks}
        if wanted <= names or time.monotonic() > deadline:
            return names
        time.sleep(0.2)
