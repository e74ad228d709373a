"""The driver-side state of a run, found by run id.

Prefect task parameters are small and serialisable (a run id, a step, a batch id); the
heavy things (actor handles, the replay buffer, the data loader) stay here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.workers.pools import WorkerPools

_RUNS: dict[str, RunContext] = {}


@dataclass
class RunContext:
    run_id: str
    config: Any
    pools: WorkerPools
    replay_buffer: Any
    val_prompts: list[dict[str, Any]]
    hooks: Any = None
    """The trainer, whose lifecycle hooks the step flow calls."""
    version: int = 0
    """Weight version (global step) that the rollout replicas serve."""
    extra: dict[str, Any] = field(default_factory=dict)


def register_run(context: RunContext) -> None:
    _RUNS[context.run_id] = context


def get_run(run_id: str) -> RunContext:
    try:
        return _RUNS[run_id]
    except KeyError:
        raise KeyError(
            f"no active run {run_id!r} in this process; active: {', '.join(_RUNS) or '(none)'}"
        ) from None


def unregister_run(run_id: str) -> None:
    _RUNS.pop(run_id, None)
