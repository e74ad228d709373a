"""The base trainer (R-2.2): it owns init -> fit -> step; modes override lifecycle hooks only."""

from __future__ import annotations

import sys
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from prefect import flow

from rl_train.config import Config, ConfigError, config_to_yaml, mode_config_errors
from rl_train.engines.model.tiny import create_tiny_policy
from rl_train.engines.workers.pools import WorkerClasses, WorkerPools, ensure_ray
from rl_train.flows.context import RunContext
from rl_train.flows.step import PhaseRunner, run_global_step, step_settings
from rl_train.flows.ui import publish_run_end, publish_step, step_run_name
from rl_train.storage.builtin_data import write_builtin_task
from rl_train.storage.dataset import PromptLoader, load_prompts
from rl_train.storage.metrics import MetricsWriter
from rl_train.storage.replay_base import ReplayBufferBase
from rl_train.storage.replay_buffer import ReplayBuffer
from rl_train.storage.replay_buffer_async import load_sampler_class
from rl_train.tasks import validate
from rl_train.tasks.context import RunHandle, attach_run, detach_run


def prepare_inputs(config: Config) -> None:
    """Create the built-in policy and task data when they are configured and missing."""
    if not Path(config.model.path).exists():
        if not config.model.create_if_missing:
            raise FileNotFoundError(
                f"model.path {config.model.path} does not exist (model.create_if_missing is off)"
            )
        print(f"creating the built-in tiny policy at {config.model.path} ...", file=sys.stderr)
        create_tiny_policy(
            config.model.path, seed=config.run.seed, pretrain_steps=config.model.pretrain_steps
        )
    data = config.data
    if data.builtin_task and not all(
        Path(p).exists() for p in data.resolved_train_files() + data.resolved_val_files()
    ):
        write_builtin_task(data.builtin_task, data.data_dir, seed=config.run.seed)


class BaseTrainer(ABC):
    """Template method: ``fit`` runs the lifecycle; subclasses fill in the hooks."""

    replay_buffer_class: type[ReplayBufferBase] = ReplayBuffer
    """The mode's replay buffer (R-2.9); ``replay.sampler`` in the config replaces it."""
    worker_classes: WorkerClasses = WorkerClasses()
    """The actor classes of the run's pools."""

    def __init__(self, config: Config, run_id: str | None = None) -> None:
        errors = mode_config_errors(config)
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        self.config = config
        self.run_id = run_id or f"{config.run.name}-{uuid.uuid4().hex[:8]}"
        self.run_dir = f"{config.run.output_dir.rstrip('/')}/{config.run.name}"
        self.history: list[dict[str, Any]] = []
        self._context: RunContext | None = None

    # -- template -----------------------------------------------------------------------
    def init(self) -> None:
        """Validate data, create the model if needed, start Ray and the worker pools.

        On failure, whatever was started is released before the error propagates."""
        prepare_inputs(self.config)
        train_prompts = load_prompts(self.config.data.resolved_train_files())
        if self.config.trainer.val_every_steps or self.config.trainer.val_before_train:
            load_prompts(self.config.data.resolved_val_files())  # fail now, not at the first validation
        self.metrics = MetricsWriter(self.run_dir, overwrite=self.config.run.overwrite)
        ensure_ray(self.config.ray.address, self.config.ray.num_cpus)
        pools = WorkerPools.create(self.run_id, self.config, self.worker_classes)
        try:
            sampling = {
                "temperature": self.config.rollout.temperature,
                "top_p": self.config.rollout.top_p,
                "max_new_tokens": self.config.rollout.max_new_tokens,
            }
            loader = PromptLoader(train_prompts, seed=self.config.run.seed)
            buffer = self.build_replay_buffer(pools, loader, sampling)
            self._context = RunContext(self.run_id, self.config, pools, buffer)
            attach_run(RunHandle(self.run_id, self.config, pools))
            self.metrics.write_text("config.yaml", config_to_yaml(self.config))
        except BaseException:
            pools.shutdown()
            detach_run(self.run_id)
            self._context = None
            raise

    def build_replay_buffer(
        self, pools: WorkerPools, loader: PromptLoader, sampling: dict[str, Any]
    ) -> ReplayBufferBase:
        """The configured sampler class, or the mode's own, over the run's queue and replicas."""
        spec = self.config.replay.sampler
        cls = load_sampler_class(spec) if spec else self.replay_buffer_class
        return cls(
            pools.tq,
            pools.rollouts,
            loader,
            self.config.rollout.n,
            sampling,
            config=self.config.replay,
            rewards=pools.rewards,
        )

    def fit(self) -> list[dict[str, Any]]:
        """init, the steps, teardown: pools, sockets and shared memory are released on every exit."""
        try:
            self.init()
            self.on_train_begin()
            pending_val = self._validate(0) if self.config.trainer.val_before_train else {}
            for step in range(1, self.config.trainer.total_steps + 1):
                started = time.perf_counter()
                self.on_step_begin(step)
                metrics: dict[str, Any] = {"step": step, **pending_val, **self.step(step)}
                pending_val = {}
                if self._is_validation_step(step):
                    metrics.update(self._validate(step))
                metrics["timing/step"] = time.perf_counter() - started
                metrics.update(self.rollout_activity(metrics["timing/step"]))
                self.history.append(metrics)
                self.metrics.write(metrics)
                self._print_progress(metrics)
            publish_run_end(self.config.run.name, self.run_dir)
            return self.history
        finally:
            try:
                if self._context is not None:
                    self.on_train_end()
            finally:
                self.teardown()

    def step(self, step: int) -> dict[str, float]:
        """One global step: a Prefect sub-flow of phase tasks, or the phases called directly."""
        if not self.config.trainer.use_prefect:
            return run_global_step(self, step, direct=True)
        with step_settings():
            return self.global_step_flow(step)

    @flow(name="global-step", flow_run_name=step_run_name, validate_parameters=False, log_prints=True)
    def global_step_flow(self, step: int) -> dict[str, float]:
        return run_global_step(self, step, direct=False)

    def _is_validation_step(self, step: int) -> bool:
        every = self.config.trainer.val_every_steps
        return bool(every) and (step % every == 0 or step == self.config.trainer.total_steps)

    def _validate(self, step: int) -> dict[str, float]:
        self.on_validate_begin(step)
        result = (
            validate(self.run_id, step) if self.config.trainer.use_prefect else validate.fn(self.run_id, step)
        )
        self.on_validate_end(step, result)
        return result

    def rollout_activity(self, wall_seconds: float) -> dict[str, float]:
        """How much of the step the rollout engines generated (mean over replicas), and the
        groups still waiting on tool calls: where async modes win, this is where sync idles."""
        activity = self.pools.pop_rollout_activity()
        busy = sum(a["busy_seconds"] for a in activity) / max(len(activity), 1)
        return {
            "rollout/busy_seconds": busy,
            "rollout/idle_fraction": max(0.0, 1.0 - busy / wall_seconds) if wall_seconds > 0 else 0.0,
            "rollout/groups_awaiting_tools": sum(a["groups_awaiting_tools"] for a in activity),
        }

    def _print_progress(self, m: dict[str, Any]) -> None:
        total = self.config.trainer.total_steps
        parts = [f"step {m['step']:>4}/{total}", f"reward {m.get('reward/mean', 0):.3f}"]
        if "val/reward_mean" in m:
            parts.append(f"val {m['val/reward_mean']:.3f}")
        parts += [
            f"loss {m.get('actor/loss', 0):+.4f}",
            f"len {m.get('response_length/mean', 0):.1f}",
            f"{m['timing/step']:.2f}s",
        ]
        line = " | ".join(parts)
        print(line, file=sys.stderr, flush=True)
        publish_step(self.config.run.name, total, line, m)  # the run page in the Prefect UI

    def teardown(self) -> None:
        """Close weight sync and kill the run's actors (idempotent)."""
        if self._context is not None:
            context, self._context = self._context, None
            try:
                context.pools.shutdown()
            finally:
                detach_run(self.run_id)

    @property
    def context(self) -> RunContext:
        if self._context is None:
            raise RuntimeError("the trainer has no running pools: call init() (or fit()) first")
        return self._context

    @property
    def pools(self) -> WorkerPools:
        return self.context.pools

    @property
    def replay_buffer(self) -> ReplayBufferBase:
        return self.context.replay_buffer

    # -- hooks (R-2.2) ------------------------------------------------------------------
    def on_train_begin(self) -> None:
        return None

    def on_train_end(self) -> None:
        return None

    def on_step_begin(self, step: int) -> None:
        return None

    @abstractmethod
    def on_step_end(self, step: int, run: PhaseRunner) -> dict[str, float]:
        """How the new weights reach rollout; returns the sync's metrics."""

    def on_sample_begin(self, step: int, local_update: int) -> None:
        return None

    @abstractmethod
    def on_sample_end(self, step: int, local_update: int) -> None:
        """What happens to rollout memory after sampling."""

    def on_validate_begin(self, step: int) -> None:
        return None

    def on_validate_end(self, step: int, metrics: dict[str, float]) -> None:
        return None

    def on_save_checkpoint(self, step: int) -> None:
        return None
