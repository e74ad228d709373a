"""What the Prefect UI shows of a training run: the step lines in the ``rl-train`` run's logs, a
progress artifact, a table of the latest metrics and, at the end, the reward curve.

The project keeps Prefect's own loggers at WARNING (a CLI run would otherwise print every
task's state changes), which also drops INFO lines sent through ``get_run_logger()``. The step
lines therefore go through a logger of their own, ``rl_train.progress``, whose only handler
sends to the API: the run page gets them, the terminal keeps the trainer's own stderr line.

Every function here is a no-op, with no API call, outside a Prefect flow run (``rl-train train
--no-prefect``, or a trainer fitted directly). Publishing is best effort: an artifact the API
refuses is reported on stderr and never stops training. A step's artifacts are sent by one
background thread, in order, in the flow run's context: their two API calls (30-60 ms on two
busy cores) are off the step loop. ``publish_run_end`` waits for what is still queued first.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.context import FlowRunContext
from prefect.logging.handlers import APILogHandler

from rl_train.flows.reward_chart import Series, render_svg, reward_series, svg_data_uri
from rl_train.storage.metrics import read_metrics

PROGRESS_LOGGER = "rl_train.progress"
"""The logger of the step lines; its records reach the API only, never the console."""
MAX_KEY_STEM = 48
"""Artifact keys stay short enough to read in the UI's artifact list."""

_progress_artifacts: dict[UUID, UUID] = {}
"""Flow run id -> its progress artifact, created at the first step this process publishes and
updated after. Keyed by flow run, so a second run in the same process gets its own."""
_publisher = ThreadPoolExecutor(1, thread_name_prefix="rl-train-publish")
"""One thread: a run's artifacts reach the API in the order they were published."""
_queued: list[Future[None]] = []


def _in_background(send: Callable[[], None]) -> None:
    """Run ``send`` on the publishing thread, in this thread's context (the flow run's)."""
    context = contextvars.copy_context()
    _queued[:] = [f for f in _queued if not f.done()]
    _queued.append(_publisher.submit(context.run, send))


def wait_for_published(timeout_seconds: float = 30.0) -> None:
    """Block until everything queued so far has been sent (or has failed, which it reports)."""
    for future in list(_queued):
        with contextlib.suppress(Exception):
            future.result(timeout=timeout_seconds)
    _queued.clear()


def artifact_key(run_name: str, kind: str) -> str:
    """``<run>-<kind>`` in what Prefect accepts as a key (lowercase letters, digits, dashes):
    every other character becomes a dash, runs of dashes collapse, and the stem is cut to
    ``MAX_KEY_STEM``. A key groups the versions of one artifact, so "latest" is per run."""
    stem = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-")[:MAX_KEY_STEM].strip("-")
    return f"{stem or 'run'}-{kind}"


def step_run_name() -> str:
    """The name of a ``global-step`` sub-flow run, ``<run.name>/step-N``: the runs list then
    tells the steps of two runs apart. Prefect calls it inside the sub-flow's context, whose
    parameters are the bound method's (``self``, the trainer, and ``step``)."""
    context = FlowRunContext.get()
    if context is None or context.parameters is None:
        raise RuntimeError("step_run_name is called by Prefect inside a global-step flow run")
    trainer, step = context.parameters["self"], context.parameters["step"]
    return f"{trainer.config.run.name}/step-{step}"


def _current_flow_run_id() -> UUID | None:
    context = FlowRunContext.get()
    return context.flow_run.id if context is not None and context.flow_run is not None else None


def _progress_logger() -> logging.Logger:
    logger = logging.getLogger(PROGRESS_LOGGER)
    if not logger.handlers:
        logger.addHandler(APILogHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


@contextlib.contextmanager
def _best_effort(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # the API may refuse or be briefly away; training goes on
        print(f"rl-train: could not publish {what} to Prefect: {exc}", file=sys.stderr, flush=True)


def _table_value(value: Any) -> Any:
    """Numbers to 6 significant digits; NaN and infinities as text (JSON has no such number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if not math.isfinite(value):
        return str(value)
    return value if isinstance(value, int) else float(f"{value:.6g}")


def metrics_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric, sorted by name, for the table artifact."""
    return [{"metric": key, "value": _table_value(metrics[key])} for key in sorted(metrics)]


def publish_step(run_name: str, total_steps: int, line: str, metrics: dict[str, Any]) -> None:
    """After each global step: its progress line to the run's logs, the progress artifact to
    step / total, and the latest-metrics table (one new version under a stable key)."""
    flow_run_id = _current_flow_run_id()
    if flow_run_id is None:
        return
    _progress_logger().info(line, extra={"flow_run_id": flow_run_id})  # batched by Prefect's handler
    step = int(metrics["step"])
    table = metrics_table(metrics)

    def send() -> None:
        percent = 100.0 * step / max(total_steps, 1)
        description = f"{run_name}: step {step} of {total_steps}"
        with _best_effort("the progress artifact"):
            if flow_run_id in _progress_artifacts:
                update_progress_artifact(_progress_artifacts[flow_run_id], percent, description=description)
            else:
                created = create_progress_artifact(
                    percent, key=artifact_key(run_name, "progress"), description=description
                )
                # Prefect's dispatcher returns a coroutine only when called from async code
                assert isinstance(created, UUID), "send runs in a plain thread, never in an event loop"
                _progress_artifacts[flow_run_id] = created
        with _best_effort("the metrics table"):
            create_table_artifact(
                table,
                key=artifact_key(run_name, "metrics"),
                description=f"{run_name}: metrics of step {step} of {total_steps}",
            )

    _in_background(send)


def reward_curve_markdown(run_name: str, rows: list[dict[str, Any]]) -> str:
    """The markdown artifact's text: the chart as an inline image, then the figures it draws."""
    return curve_markdown(f"Reward curve of {run_name}", reward_series(rows), f"{run_name}: reward")


def curve_markdown(heading: str, series: list[Series], chart_title: str) -> str:
    """A heading, the chart of ``series`` as an inline image, then each series' figures
    (the evaluation flow draws its per-dataset curves with it too)."""
    image = svg_data_uri(render_svg(series, chart_title))
    lines = [f"# {heading}", "", f"![{heading[:1].lower()}{heading[1:]}]({image})", ""]
    lines += ["| metric | steps | first | last | best |", "|---|---|---|---|---|"]
    for s in series:
        if s.points:
            values = [y for _, y in s.points]
            lines.append(
                f"| {s.label} | {len(values)} | {values[0]:.4f} | {values[-1]:.4f} | {max(values):.4f} |"
            )
        else:
            lines.append(f"| {s.label} | 0 | - | - | - |")
    return "\n".join(lines) + "\n"


def publish_run_end(run_name: str, run_dir: str) -> None:
    """At the end of a run: the reward curve over every step in the run's ``metrics.jsonl``
    (read back rather than taken from memory, so a resumed run's curve starts at step 1)."""
    if _current_flow_run_id() is None:
        return
    wait_for_published()
    with _best_effort("the reward curve"):
        create_markdown_artifact(
            reward_curve_markdown(run_name, read_metrics(run_dir)),
            key=artifact_key(run_name, "reward-curve"),
            description=f"{run_name}: reward/mean per step and val/reward_mean at validation steps",
        )


def resolve_step_layout(configured: str) -> str:
    """``trainer.step_layout`` made concrete: ``auto`` is ``nested`` when this process reports
    to a Prefect server of the user's (``PREFECT_API_URL`` in the environment or the profile:
    a server with a UI, where each step's own flow run is worth its cost), and ``flat`` on the
    temporary API a run starts for itself (``flows/prefect_api.py``: no UI, gone at the run's
    end) or Prefect's in-process one (no URL at all)."""
    if configured != "auto":
        return configured
    import os

    from prefect.settings import get_current_settings

    from rl_train.flows.prefect_api import TEMPORARY_API_ENV

    url = get_current_settings().api.url
    return "nested" if url and url != os.environ.get(TEMPORARY_API_ENV) else "flat"


UNFINISHED_STATES = ("SCHEDULED", "PENDING", "RUNNING")


def end_stale_steps(resumed_from: int) -> list[str]:
    """A resumed training run (a retry of a killed one, in the same flow run) marks what the
    killed attempt left unfinished as Crashed, so that its page shows no step still running:
    the step sub-flow runs (the nested layout), and the training run's own phase task runs
    ``step-N/<phase>`` (the flat layout). Called before this attempt starts any step or task,
    so every unfinished child is the killed attempt's. Returns the names of the runs ended;
    outside a flow run, nothing."""
    parent = _current_flow_run_id()
    if parent is None:
        return []
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    ended: list[str] = []
    with _best_effort("the end of the killed attempt's steps"), get_client(sync_client=True) as client:
        stale = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType(s) for s in UNFINISHED_STATES])
                ),
            )
        )
        message = f"its process was killed; the run resumed from checkpoint {resumed_from}"
        for run in stale:
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
            ended.append(run.name)
        unfinished = [StateType(s) for s in UNFINISHED_STATES]
        stale_tasks = client.read_task_runs(
            task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[parent]),
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=unfinished)),
            )
        )
        for task_run in stale_tasks:
            if not task_run.name.startswith("step-"):  # only the flat layout's phases
                continue
            client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
            ended.append(task_run.name)
    return ended
