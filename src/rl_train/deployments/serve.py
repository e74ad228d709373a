"""The ``rl-train/<mode>`` deployments, served by ``rl-train serve`` (R-10.1).

``prefect deployment run rl-train/sync -p config=configs/arith-tiny.yaml`` (or
``rl-train/colocate``, ``rl-train/separate``) then starts a training run in the serving
process's runner. Each mode's deployment pins ``trainer.mode``
through the flow's ``mode`` parameter, so a deployment always runs the mode its name says,
whatever ``overrides`` a run passes, and records the root its relative paths resolve under
(``root``: ``RL_TRAIN_ROOT``, else the directory serve was started from).

Serve needs a Prefect server that outlives it (``PREFECT_API_URL``): without one it serves on
a throwaway server of its own, and says so. With one, its runs send heartbeats and the server
gets the automation that marks a run Crashed when they stop (``crash_detection``).
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import serve
from prefect.settings import get_current_settings

from rl_train.deployments.crash_detection import ensure_crash_automation, heartbeat_seconds, silence_seconds
from rl_train.deployments.eval_schedule import EVAL_SLOTS, EvalScheduleConfig, build_eval_deployment
from rl_train.flows.deployment_run import ROOT_ENV, serve_root
from rl_train.flows.train import train_flow

EPHEMERAL_NOTICE = """\
rl-train serve: PREFECT_API_URL is not set, so these deployments are served on a throwaway
Prefect server that lives only inside this process. `prefect deployment run` in another shell
cannot reach it, and its runs vanish when serve stops. For a server that outlives serve:

    prefect server start                                   # in a shell of its own
    export PREFECT_API_URL=http://127.0.0.1:4200/api       # in every shell that uses it
    rl-train serve
"""

DEPLOYMENT_MODES = {"sync": "sync", "colocate": "colocate_async", "separate": "separate_async"}
"""Deployment name -> trainer mode."""


def deployment_parameters(mode: str, root: str | None = None) -> dict[str, Any]:
    """Default parameters of a mode's deployment: only the mode is pinned (through ``mode``,
    which a run's own ``overrides`` cannot replace); the mode's other defaults (e.g.
    separate_async's parameter_sync_step 4) come from its class and never override what the
    run's config file sets. ``root`` (default ``serve_root()``) is where its relative paths
    resolve."""
    return {"config": None, "overrides": [], "mode": mode, "root": root or serve_root()}


def build_deployments(root: str | None = None) -> list[Any]:
    deployments = []
    for name, mode in DEPLOYMENT_MODES.items():
        deployments.append(
            train_flow.to_deployment(
                name=name,
                parameters=deployment_parameters(mode, root),
                description=f"rl-train in {mode} mode: pass -p config=<yaml> and optionally overrides",
                tags=["rl-train", mode],
            )
        )
    return deployments


def prepare_server(root: str) -> None:
    """Say which server serve uses and where paths resolve; on a real server, make sure the
    crash-detection automation is there."""
    if get_current_settings().api.url:  # the environment or the active Prefect profile
        silence = silence_seconds()
        done = ensure_crash_automation(silence)
        print(f"rl-train serve: runs silent for {silence:.0f} s are marked Crashed (automation {done})", file=sys.stderr)
    else:
        print(EPHEMERAL_NOTICE, file=sys.stderr, flush=True)
    print(f"rl-train serve: relative paths of runs resolve under {root} ({ROOT_ENV})", file=sys.stderr)


def serve_deployments(limit: int = 1, eval_schedule: EvalScheduleConfig | None = None) -> None:
    """Serve every mode's deployment and the eval deployment (on ``eval_schedule``, if it has
    one; its runs get slots of their own beyond ``limit``) until interrupted; see the module
    docstring."""
    root = serve_root()
    prepare_server(root)
    evaluation = build_eval_deployment(eval_schedule or EvalScheduleConfig(), root)
    serve(*build_deployments(root), evaluation, limit=limit + EVAL_SLOTS, heartbeat_seconds=heartbeat_seconds())
