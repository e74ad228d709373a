"""The ``rl-train/<mode>`` deployments, served by ``rl-train serve`` (R-10.1).

``prefect deployment run rl-train/sync -p config=configs/arith-tiny.yaml`` (or
``rl-train/colocate``, ``rl-train/separate``) then starts a training run in the serving
process's runner. Each mode's deployment pins ``trainer.mode``
through the flow's ``mode`` parameter, so a deployment always runs the mode its name says,
whatever ``overrides`` a run passes.
"""

from __future__ import annotations

from typing import Any

from prefect import serve

from rl_train.flows.train import train_flow

DEPLOYMENT_MODES = {"sync": "sync", "colocate": "colocate_async", "separate": "separate_async"}
"""Deployment name -> trainer mode."""


def deployment_parameters(mode: str) -> dict[str, Any]:
    """Default parameters of a mode's deployment: only the mode is pinned (through ``mode``,
    which a run's own ``overrides`` cannot replace); the mode's other defaults (e.g.
    separate_async's parameter_sync_step 4) come from its class and never override what the
    run's config file sets."""
    return {"config": None, "overrides": [], "mode": mode}


def build_deployments() -> list[Any]:
    deployments = []
    for name, mode in DEPLOYMENT_MODES.items():
        deployments.append(
            train_flow.to_deployment(
                name=name,
                parameters=deployment_parameters(mode),
                description=f"rl-train in {mode} mode: pass -p config=<yaml> and optionally overrides",
                tags=["rl-train", mode],
            )
        )
    return deployments


def serve_deployments(limit: int = 1) -> None:
    serve(*build_deployments(), limit=limit)
