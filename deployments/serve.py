"""The ``rl-train/<mode>`` deployments, served by ``rl-train serve`` (R-10.1).

``prefect deployment run rl-train/sync -p config=configs/arith-tiny.yaml`` then starts a
training run in the serving process's runner. Each mode's deployment pins ``trainer.mode``
through an override, so a deployment always runs the mode its name says.
"""

from __future__ import annotations

from typing import Any

from prefect import serve

from rl_train.flows.train import train_flow

DEPLOYMENT_MODES = {"sync": "sync"}
"""Deployment name -> trainer mode; the async modes are added when they land."""


def build_deployments() -> list[Any]:
    deployments = []
    for name, mode in DEPLOYMENT_MODES.items():
        deployments.append(
            train_flow.to_deployment(
                name=name,
                parameters={"config": None, "overrides": [f"trainer.mode={mode}"]},
                description=f"rl-train in {mode} mode: pass -p config=<yaml> and optionally overrides",
                tags=["rl-train", mode],
            )
        )
    return deployments


def serve_deployments(limit: int = 1) -> None:
    serve(*build_deployments(), limit=limit)
