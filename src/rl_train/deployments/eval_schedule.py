"""The ``rl-eval/newest-checkpoint`` deployment and its schedule (R-10.1).

``rl-train serve`` serves it beside the training deployments. Without a schedule it evaluates
on demand (``prefect deployment run rl-eval/newest-checkpoint -p run_dir=runs/my-run``); with
``--eval-run-dir`` and ``--eval-every SECONDS`` or ``--eval-cron``, the server starts a run on
that schedule, and each run evaluates the run's newest complete checkpoint unless it already
has (``rl_train.flows.evaluate``).

At most one evaluation runs at a time: a scheduled run that comes while one is still running
is cancelled rather than queued (its checkpoint is the next one's anyway). Serve allows one
flow run beyond ``--limit`` for it, so that a run training at the limit is evaluated while it
trains (Prefect's runner counts all its flow runs alike: while no evaluation runs, that slot
can take a training run too).
"""

from __future__ import annotations

from typing import Any

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.client.schemas.schedules import CronSchedule
from pydantic import Field, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.flows.evaluate import eval_flow

EVAL_DEPLOYMENT = "newest-checkpoint"
"""The deployment's name; with its flow's: ``rl-eval/newest-checkpoint``."""
EVAL_SLOTS = 1
"""Evaluations that may run at once (and the slots serve adds for them)."""


class EvalScheduleConfig(StrictModel):
    run_dir: str | None = None
    """Run directory (a path, relative to serve's root, or an s3:// URI) that scheduled runs evaluate; None: runs name their own."""
    interval_seconds: int | None = Field(None, ge=1)
    """Evaluate every N seconds (None: no interval schedule)."""
    cron: str | None = None
    """Evaluate on this cron schedule, e.g. '*/30 * * * *' (None: no cron schedule)."""
    extra_val_files: list[str] = Field(default_factory=list)
    """Datasets scored beside the run's validation set, each reported under its file stem."""

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str | None) -> str | None:
        if value is not None:
            CronSchedule(cron=value)  # its ValueError names the string
        return value

    @model_validator(mode="after")
    def _schedule_is_whole(self) -> EvalScheduleConfig:
        if self.interval_seconds is not None and self.cron is not None:
            raise ValueError("set interval_seconds or cron, not both")
        if self.scheduled and self.run_dir is None:
            raise ValueError("a schedule needs run_dir: the run whose checkpoints it evaluates")
        return self

    @property
    def scheduled(self) -> bool:
        return self.interval_seconds is not None or self.cron is not None


def eval_deployment_parameters(schedule: EvalScheduleConfig, root: str) -> dict[str, Any]:
    """What a run of the deployment gets unless it passes its own: the run (when configured),
    the extra datasets and the root its relative paths resolve under."""
    parameters: dict[str, Any] = {"extra_val_files": schedule.extra_val_files, "root": root}
    if schedule.run_dir is not None:
        parameters["run_dir"] = schedule.run_dir
    return parameters


def build_eval_deployment(schedule: EvalScheduleConfig, root: str) -> Any:
    """The eval deployment, on ``schedule``'s interval or cron when it has one."""
    what = f"the newest checkpoint of {schedule.run_dir}" if schedule.run_dir else "a run's newest checkpoint"
    return eval_flow.to_deployment(
        name=EVAL_DEPLOYMENT,
        parameters=eval_deployment_parameters(schedule, root),
        interval=schedule.interval_seconds,
        cron=schedule.cron,
        concurrency_limit=ConcurrencyLimitConfig(
            limit=EVAL_SLOTS, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
        ),
        description=f"rl-eval: score {what} on its validation set (pass -p run_dir=<run dir>)",
        tags=["rl-train", "eval"],
    )
