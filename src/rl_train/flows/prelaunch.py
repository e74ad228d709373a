"""The run's actors asked for before its flow begins, so that they start beside Prefect's API.

A run through Prefect cannot create its pools before its flow run has begun, and the flow
run cannot begin before Prefect's temporary API answers (seconds of its own start-up, on the
same cores). The actors do not need the API: ``rl-train train`` asks Ray for them as soon as
Ray is up (``prelaunch``), their processes import torch and load the policy while the API
comes up, and the trainer built inside the flow takes them over (``adopt``) when its config
is the one they were launched for. Nothing else changes: the trainer still checks its
inputs, claims its run directory and waits for the actors to be ready in ``init``.

Launched actors that no trainer takes over (the flow failed before its trainer began, the
config differed) are killed by ``abandon``, which the command calls when it ends, and at
the process's exit; after a takeover it does nothing (the trainer owns the pools then).
"""

from __future__ import annotations

import atexit
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_train.config import Config, mode_config_errors
from rl_train.engines.workers.launched import LaunchedPools
from rl_train.engines.workers.pools import WorkerClasses, WorkerPools


def new_run_id(config: Config) -> str:
    """A fresh run id: the run's name and 8 random hex digits."""
    return f"{config.run.name}-{uuid.uuid4().hex[:8]}"


@dataclass
class _Launch:
    run_id: str
    config: dict[str, Any]
    """The config the actors were launched for, as data (compared whole at ``adopt``)."""
    pools: LaunchedPools


_lock = threading.Lock()
_waiting: _Launch | None = None
"""Launched and not yet taken over."""
_launched: list[LaunchedPools] = []
"""Every launch of this process (``abandon`` kills those never made ready)."""


def prelaunch(config: Config, classes: WorkerClasses) -> str | None:
    """Ask Ray (already connected) for the actors of a run of ``config``; returns the run id
    they carry, or None when nothing was launched: the config has mode errors (the trainer
    reports them) or the policy does not exist yet (the trainer creates it first)."""
    global _waiting
    if mode_config_errors(config) or not Path(config.model.path).exists():
        return None
    run_id = new_run_id(config)
    pools = WorkerPools.launch(run_id, config, classes)
    with _lock:
        abandon_locked()
        if not _launched:
            atexit.register(abandon)
        _launched.append(pools)
        _waiting = _Launch(run_id, config.model_dump(mode="json"), pools)
    return run_id


def adopt(config: Config) -> tuple[str, LaunchedPools] | None:
    """The run id and actors launched for exactly ``config``, taken over by the caller; None
    when none were (or for another config, whose actors are then killed)."""
    global _waiting
    with _lock:
        launch, _waiting = _waiting, None
    if launch is None:
        return None
    if launch.config != config.model_dump(mode="json"):
        launch.pools.abandon()
        return None
    return launch.run_id, launch.pools


def abandon() -> None:
    """Kill the launched actors that no trainer made ready (safe to call any time, again)."""
    with _lock:
        abandon_locked()


def abandon_locked() -> None:
    global _waiting
    _waiting = None
    while _launched:
        _launched.pop().abandon()
