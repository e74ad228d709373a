"""How a phase task reaches its run: from the run id alone.

A task gets ``(run_id, step, batch_id)``. In the driver's process it uses the pools the
driver created (``attach_run``); in any other process (a Prefect retry in a fresh worker)
it rejoins the run's named Ray actors and reads the run's config from the queue actor
(``WorkerPools.join``); if they are gone it fails with ``RunGoneError``, which says so.
What is cached here is only a view that the run id rebuilds: no run state lives here.
The driver's own state (replay buffer, pending push) is the flow's ``RunContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_train.config import Config
from rl_train.engines.workers.errors import RunGoneError
from rl_train.engines.workers.pools import WorkerPools
from rl_train.storage.dataset import load_prompts

__all__ = ["RunGoneError", "RunHandle", "attach_run", "detach_run", "join_run"]


@dataclass
class RunHandle:
    run_id: str
    config: Config
    pools: WorkerPools
    _val_prompts: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def val_prompts(self) -> list[dict[str, Any]]:
        """The validation prompts, read from the configured files on first use."""
        if self._val_prompts is None:
            files: list[str | Path] = [*self.config.data.resolved_val_files()]
            self._val_prompts = load_prompts(files)
        return self._val_prompts


_HANDLES: dict[str, RunHandle] = {}


def attach_run(handle: RunHandle) -> None:
    """The driver registers the run it created, so its own tasks need no lookup."""
    _HANDLES[handle.run_id] = handle


def detach_run(run_id: str) -> None:
    _HANDLES.pop(run_id, None)


def join_run(run_id: str) -> RunHandle:
    """This process's view of the run: the driver's, or rejoined from the live actors."""
    handle = _HANDLES.get(run_id)
    if handle is None:
        pools, config = WorkerPools.join(run_id)
        handle = _HANDLES[run_id] = RunHandle(run_id, Config.model_validate(config), pools)
    return handle
