"""The ``rl-train/<mode>`` deployments, served by ``rl-train serve`` (R-10.1).

``prefect deployment run rl-train/sync -p config=configs/arith-tiny.yaml`` (or
``rl-train/colocate``, ``rl-train/separate``) then starts a training run in the serving
process's runner. Each mode's deployment pins ``trainer.mode``
through an override, so a deployment always runs the mode its name says.
"""

from __future__ import annotations

from typing import Any

from prefect import serve

from rl_train.flows.train import train_flow

DEPLOYMENT_MODES = {"sync": "sync", "colocate": "colocate_async", "separate": "separate_async"}
"""Deployment name -> trainer mode."""


def deployment_overrides(mode: str) -> list[str]:
    """Only the mode is pinned; its own defaults (e.g. separate_async's parameter_sync_step 4)
    come from the mode's class and never override what the run's config file sets."""
    return [f"trainer.mode={mode}"]


def build_deployments() -> list[Any]:
    deployments = []
    for name, mode in DEPLOYMENT_MODES.items():
        deployments.append(
            train_flow.to_deployment(
                name=name,
                parameters={"config": None, "overrides": deployment_overrides(mode)},
                description=f"rl-train in {mode} mode: pass -p config=<yaml> and optionally overrides",
                tags=["rl-train", mode],
            )
        )
    return deployments


def serve_deployments(limit: int = 1) -> None:
    serve(*build_deployments(), limit=limit)
