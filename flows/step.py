"""One global step as a flow of phase tasks (R-3.1, R-3.2), shared by every trainer mode.

The same body runs either as a Prefect sub-flow (each phase a task run in the UI, with its
state, timing and logs) or with the phase functions called directly; the benchmark compares
the two. Modes change what happens *around* the phases through the trainer's hooks.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from rl_train import tasks
from rl_train.tasks.context import get_run


class PhaseRunner:
    """Runs a phase task through Prefect or directly, and times it as ``timing/<phase>``."""

    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.timings: dict[str, float] = {}

    def __call__(self, phase: Any, *args: Any) -> Any:
        start = time.perf_counter()
        result = phase.fn(*args) if self.direct else phase(*args)
        key = f"timing/{phase.name}"
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - start
        return result


def run_global_step(run_id: str, step: int, direct: bool) -> dict[str, float]:
    """parameter_sync_step local updates, then the mode's step-end (weight sync)."""
    ctx = get_run(run_id)
    trainer, cfg = ctx.hooks, ctx.config
    run = PhaseRunner(direct)
    metrics: dict[str, float] = {}
    groups = cfg.trainer.train_batch_size // cfg.trainer.parameter_sync_step
    for local in range(cfg.trainer.parameter_sync_step):
        trainer.on_sample_begin(step, local)
        batch_id = run(tasks.generate, run_id, step, groups)
        trainer.on_sample_end(step, local)
        metrics.update(run(tasks.reward, run_id, batch_id))
        metrics.update(run(tasks.balance, run_id, batch_id))
        run(tasks.old_log_prob, run_id, batch_id)
        if cfg.actor.kl_loss or cfg.algorithm.kl_in_reward:
            run(tasks.ref, run_id, batch_id)
        metrics.update(run(tasks.advantage, run_id, batch_id))
        metrics.update(run(tasks.update, run_id, batch_id))
        ctx.replay_buffer.release(batch_id)
    metrics.update(trainer.on_step_end(step, run))
    metrics.update(run.timings)
    return metrics


@flow(name="global-step", flow_run_name="step-{step}", validate_parameters=False, log_prints=True)
def global_step_flow(run_id: str, step: int) -> dict[str, float]:
    return run_global_step(run_id, step, direct=False)


def execute_global_step(run_id: str, step: int, use_prefect: bool) -> dict[str, float]:
    """Run one global step; as a sub-flow its heartbeat is off (it would add ~1 s at exit)."""
    if not use_prefect:
        return run_global_step(run_id, step, direct=True)
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return global_step_flow(run_id, step)
