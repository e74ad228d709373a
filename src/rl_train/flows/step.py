"""One global step as a flow of phase tasks (R-3.1, R-3.2), shared by every trainer mode.

The same body runs either as a Prefect sub-flow (each phase a task run in the UI, with its
state, timing and logs) or with the phase functions called directly; the benchmark compares
the two. Modes change what happens *around* the phases through the trainer's hooks; the
optional phases (ref, the critic's values and critic_update, ReMax's greedy_baseline) follow
from the config alone (``StepPlan``), the same in every mode.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

from rl_train import tasks
from rl_train.algorithms.config import estimator_reads_greedy_baseline
from rl_train.config import Config
from rl_train.flows.metric_merge import merge_local_updates
from rl_train.tasks.retry import call_with_retries

if TYPE_CHECKING:
    from rl_train.flows.base import BaseTrainer


@dataclass(frozen=True)
class StepPlan:
    """The optional phases of every local update, decided from the config."""

    ref: bool
    """Reference log-probs, for the KL loss or the in-reward KL penalty."""
    critic: bool
    """values before the advantage phase and critic_update after it (``critic.enable``)."""
    greedy_baseline: bool
    """One greedy answer per prompt, scored, for estimators that declare it (remax)."""
    teacher: bool = False
    """The teacher's per-token scores, for a distillation loss (``teacher.path``)."""

    @classmethod
    def from_config(cls, cfg: Config) -> StepPlan:
        return cls(
            ref=cfg.actor.kl_loss or cfg.algorithm.kl_in_reward,
            critic=bool(cfg.critic.enable),
            greedy_baseline=estimator_reads_greedy_baseline(cfg.algorithm.adv_estimator),
            teacher=cfg.teacher.on,
        )


class PhaseRunner:
    """Runs a phase task through Prefect or directly, and times it as ``timing/<phase>``.

    ``label``: the task runs are named ``<label>/<phase>`` (the flat layout, where the phases of
    every step are task runs of the training flow run and the name tells the steps apart);
    None keeps Prefect's own names (inside a step's sub-flow run, the flow run tells them)."""

    def __init__(self, direct: bool, label: str | None = None) -> None:
        self.direct = direct
        self.label = label
        self.timings: dict[str, float] = {}

    def __call__(self, phase: Any, *args: Any) -> Any:
        start = time.perf_counter()
        if self.direct:
            result = call_with_retries(phase.fn, args, phase.retries)
        elif self.label is not None:
            result = phase.with_options(task_run_name=f"{self.label}/{phase.name}")(*args)
        else:
            result = phase(*args)
        key = f"timing/{phase.name}"
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - start
        return result


def run_global_step(trainer: BaseTrainer, step: int, direct: bool, label: str | None = None) -> dict[str, float]:
    """parameter_sync_step local updates, then the mode's step-end (weight sync); ``label``
    names the phases' task runs (``PhaseRunner``)."""
    ctx, cfg, run_id = trainer.context, trainer.config, trainer.run_id
    run = PhaseRunner(direct, label)
    plan = StepPlan.from_config(cfg)
    parts: list[dict[str, float]] = []
    groups = cfg.trainer.train_batch_size // cfg.trainer.parameter_sync_step
    for local in range(cfg.trainer.parameter_sync_step):
        part: dict[str, float] = {}
        parts.append(part)
        trainer.on_sample_begin(step, local)
        batch_id = run(tasks.generate, ctx.replay_buffer, step, groups)
        if plan.greedy_baseline:  # before rollout sleeps: the replicas that sampled answer greedily
            part.update(run(tasks.greedy_baseline, run_id, batch_id))
        trainer.on_sample_end(step, local)
        part.update(run(tasks.reward, run_id, batch_id))
        if plan.teacher:
            part.update(run(tasks.teacher, run_id, batch_id))
        part.update(run(tasks.balance, run_id, batch_id))
        part.update(run(tasks.old_log_prob, run_id, batch_id))
        if plan.ref:
            run(tasks.ref, run_id, batch_id)
        if plan.critic:
            run(tasks.values, run_id, batch_id)
        part.update(run(tasks.advantage, run_id, batch_id))
        if plan.critic:
            part.update(run(tasks.critic_update, run_id, batch_id))
        part.update(run(tasks.update, run_id, batch_id))
        ctx.trained += ctx.pools.queue.batch(batch_id, ["groups"])["groups"]
        ctx.replay_buffer.release(batch_id)
    metrics = merge_local_updates(parts)  # every local update's groups, not only the last's
    metrics.update(trainer.on_step_end(step, run))
    metrics.update(run.timings)
    return metrics


_STEP_SETTINGS: dict[int, Any] = {}
"""The step sub-flows' settings, derived once per settings object they derive from (building
them anew, as ``temporary_settings`` does, costs tens of milliseconds of validation a step)."""


@contextlib.contextmanager
def step_settings() -> Iterator[None]:
    """A global step runs as a sub-flow with its heartbeat off (it would add ~1 s at exit)."""
    import prefect.context

    context = prefect.context.get_settings_context()
    cached = _STEP_SETTINGS.get(id(context.settings))
    if cached is None or cached[0] is not context.settings:
        derived = context.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
        cached = _STEP_SETTINGS[id(context.settings)] = (context.settings, derived)
    with prefect.context.SettingsContext(profile=context.profile, settings=cached[1]):
        yield
