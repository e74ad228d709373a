"""The base trainer (R-2.2): it owns init -> fit -> step; modes override lifecycle hooks only."""

from __future__ import annotations

import logging
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from prefect import flow

from rl_train import startup_clock
from rl_train.config import Config, ConfigError, config_to_yaml, mode_config_errors
from rl_train.engines.agent.config import check_agent_loop
from rl_train.engines.weight_sync.adapters import merged_sync_note
from rl_train.engines.workers.errors import find_cause
from rl_train.engines.workers.launched import LaunchedPools
from rl_train.engines.workers.pools import WorkerClasses, WorkerPools, ensure_ray
from rl_train.flows.checkpointing import DriverState, RunCheckpointer, read_driver_state
from rl_train.flows.context import RunContext
from rl_train.flows.prelaunch import adopt, new_run_id
from rl_train.flows.resume import LEDGER_FILE, RunStart, checkpoint_store, open_run_files, plan_run_start
from rl_train.flows.step import PhaseRunner, run_global_step, step_settings
from rl_train.flows.ui import (
    end_stale_steps,
    publish_run_end,
    publish_step,
    resolve_step_layout,
    step_run_name,
    wait_for_published,
)
from rl_train.storage.builtin_data import write_builtin_task
from rl_train.storage.checkpoint import CheckpointCorruptError, CheckpointError, CheckpointStore
from rl_train.storage.dataset import PromptLoader, load_prompts
from rl_train.storage.metrics import METRICS_FILE
from rl_train.storage.replay_base import ReplayBufferBase
from rl_train.storage.replay_buffer import ReplayBuffer
from rl_train.storage.replay_buffer_async import load_sampler_class
from rl_train.tasks import validate
from rl_train.tasks.context import RunHandle, attach_run, detach_run

logger = logging.getLogger(__name__)
POLICY_DIR = "policy"
"""Where a finished run leaves its policy, an HF model directory (R-9.5)."""


def prepare_inputs(config: Config) -> None:
    """Create the built-in policy, reward models and task data when they are configured and missing."""
    if not Path(config.model.path).exists():
        if not config.model.create_if_missing:
            raise FileNotFoundError(
                f"model.path {config.model.path} does not exist (model.create_if_missing is off)"
            )
        print(f"creating the built-in tiny policy at {config.model.path} ...", file=sys.stderr)
        from rl_train.engines.model.tiny import create_tiny_policy  # transformers' models: only when needed

        create_tiny_policy(
            config.model.path,
            seed=config.run.seed,
            pretrain_steps=config.model.pretrain_steps,
            prior_correct=config.model.pretrain_prior_correct,
            pretrain_task=config.model.pretrain_task,
        )
    from rl_train.engines.reward.model_config import create_missing_reward_models

    create_missing_reward_models(config.reward.models, seed=config.run.seed)
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
        self._launched: LaunchedPools | None = None
        """Actors asked for before the flow began (``flows/prelaunch.py``), made ready in ``init``."""
        adopted = None if run_id else adopt(config)
        if adopted is not None:
            run_id, self._launched = adopted
        self.run_id = run_id or new_run_id(config)
        self.run_dir = f"{config.run.output_dir.rstrip('/')}/{config.run.name}"
        self.history: list[dict[str, Any]] = []
        self._context: RunContext | None = None
        self.start_step = 0
        """The step the run continues after: 0 fresh, k when resumed from checkpoint k."""
        self.requeued: list[str] = []
        """Resumed: the prompt groups that were in flight at the checkpoint, generated anew."""
        self.checkpointer: RunCheckpointer | None = None

    # -- template -----------------------------------------------------------------------
    def init(self) -> None:
        """Validate data, create the model if needed, start Ray and the worker pools.

        On failure, whatever was started is released before the error propagates."""
        launched, self._launched = self._launched, None
        note = merged_sync_note(self.config.actor.lora, self.config.rollout.engine)
        if note is not None:
            print(note, file=sys.stderr)
        try:
            prepare_inputs(self.config)
            train_prompts = load_prompts(self.config.data.resolved_train_files(), check_agent_name=check_agent_loop)
            if self.config.trainer.val_every_steps or self.config.trainer.val_before_train:
                load_prompts(self.config.data.resolved_val_files(), check_agent_name=check_agent_loop)  # fail now
            start = plan_run_start(self.config, self.run_dir)
            store = checkpoint_store(self.config, self.run_dir)
            if start.kind != "resume":  # claimed now; a resume claims its files once it has loaded
                self._open_run_files(start, store)
            ensure_ray(self.config.ray.address, self.config.ray.num_cpus, self.config.num_actors)
            if launched is None:
                launched = WorkerPools.launch(self.run_id, self.config, self.worker_classes)
        except BaseException:
            if launched is not None:
                launched.abandon()
            raise
        pools = launched.ready()
        startup_clock.mark("workers")
        try:
            sampling = {
                "temperature": self.config.rollout.temperature,
                "top_p": self.config.rollout.top_p,
                "max_new_tokens": self.config.rollout.max_new_tokens,
                # R3: rollout keeps each token's experts for the training passes to replay
                "return_routes": self.config.actor.router_replay == "r3",
            }
            loader = PromptLoader(train_prompts, seed=self.config.run.seed)
            buffer = self.build_replay_buffer(pools, loader, sampling)
            buffer.revive = self._revive_rollouts
            self._context = RunContext(self.run_id, self.config, pools, buffer)
            if start.kind == "resume":
                step = self._restore_newest(store, start.checkpoint_step) if start.checkpoint_step else 0
                self._open_run_files(RunStart("resume", step), store)
                startup_clock.mark("restored")
                end_stale_steps(step)  # a retried flow run: the killed attempt's steps, on its page
            attach_run(RunHandle(self.run_id, self.config, pools))
            self.metrics.write_text("config.yaml", config_to_yaml(self.config))
            self.checkpointer = RunCheckpointer.for_run(self.config, store)
        except BaseException:
            pools.shutdown()
            detach_run(self.run_id)
            self._context = None
            raise

    def _open_run_files(self, start: RunStart, store: CheckpointStore) -> None:
        files = open_run_files(self.config, self.run_dir, start, store)
        self.metrics, self.ledger, self.history = files.metrics, files.ledger, files.history

    def _restore_newest(self, store: CheckpointStore, step: int) -> int:
        """Restore checkpoint ``step`` or, when a file of it does not match its manifest (the
        workers check each checksum as they load), the newest older one that loads; 0 when
        none does (the run starts over). Returns the step restored. Each load replaces every
        worker's state whole, so a load that failed half-way leaves nothing behind."""
        while step:
            try:
                self._restore(store, step)
                return step
            except Exception as exc:
                damage = find_cause(exc, CheckpointCorruptError)
                if damage is None:
                    raise
                logger.warning("skipping checkpoint %s: %s", store.step_uri(step), damage)
                step = store.latest_valid(content=False, below=step) or 0
        return 0

    def _restore(self, store: CheckpointStore, step: int) -> None:
        """Load checkpoint ``step`` into the fresh pools and the driver (R-9.3)."""
        driver = read_driver_state(store, step)
        expected = self.driver_state(step)
        shape = ("num_ranks", "num_rollouts", "num_critic_ranks")
        changed = [f"{n} {getattr(driver, n)} -> {getattr(expected, n)}" for n in shape if getattr(driver, n) != getattr(expected, n)]
        if changed:
            raise CheckpointError(
                f"checkpoint {store.step_uri(step)} was saved by a run of another shape ({', '.join(changed)}); "
                "resume it with the pool sizes it was saved with"
            )
        self.requeued = self.pools.load_checkpoint(store.root, step, None, driver.version)
        self.replay_buffer.load_state_dict(driver.buffer)
        self.context.version = driver.version
        self.start_step = step
        print(
            f"resuming {self.run_dir} from checkpoint {store.step_uri(step)}: step {step + 1} is next, "
            f"{len(self.requeued)} prompt group(s) in flight go back to rollout",
            file=sys.stderr,
        )

    def _revive_rollouts(self) -> list[int]:
        """Replicas that died and were restarted get the weights rollout serves now."""
        restarted = self.pools.revive_rollouts(self.context.version)
        if restarted:
            logger.warning("rollout replica(s) %s died and were restarted with weight version %d", restarted, self.context.version)
        return restarted

    def driver_state(self, step: int) -> DriverState:
        return DriverState(
            step=step,
            version=self.context.version,
            buffer=self.replay_buffer.state_dict(),
            num_ranks=len(self.pools.trainer.ranks),
            num_rollouts=len(self.pools.rollout.replicas),
            num_critic_ranks=len(self.pools.critic.ranks),
        )

    def _checkpoint(self, step: int) -> dict[str, float]:
        """Start checkpoint ``step`` when it is due; returns how long the step loop was held."""
        if self.checkpointer is None or not self.checkpointer.due(step):
            return {}
        run_files = {METRICS_FILE: self.metrics.contents(), LEDGER_FILE: self.ledger.contents()}
        held = self.checkpointer.save(step, self.pools, self.driver_state(step), run_files)
        return {"timing/checkpoint": held}

    def build_replay_buffer(
        self, pools: WorkerPools, loader: PromptLoader, sampling: dict[str, Any]
    ) -> ReplayBufferBase:
        """The configured sampler class, or the mode's own, over the run's queue and replicas."""
        spec = self.config.replay.sampler
        cls = load_sampler_class(spec) if spec else self.replay_buffer_class
        buffer: ReplayBufferBase = cls(
            pools.queue.records,
            pools.rollout.replicas,
            loader,
            self.config.rollout.n,
            sampling,
            config=self.config.replay,
            rewards=pools.reward.workers,
        )
        buffer.streaming = self.config.reward.streaming
        return buffer

    def fit(self) -> list[dict[str, Any]]:
        """init, the steps, teardown: pools, sockets and shared memory are released on every exit."""
        try:
            self.init()
            if self.start_step:
                self.replay_buffer.requeue(self.requeued, self.start_step + 1)
            self.on_train_begin()
            fresh = not self.start_step
            pending_val = self._validate(0) if self.config.trainer.val_before_train and fresh else {}
            held: dict[str, float] = {}
            for step in range(self.start_step + 1, self.config.trainer.total_steps + 1):
                started = time.perf_counter()
                self.on_step_begin(step)
                metrics: dict[str, Any] = {"step": step, **pending_val, **held, **self.step(step)}
                pending_val = {}
                if self._is_validation_step(step):
                    metrics.update(self._validate(step))
                metrics["timing/step"] = time.perf_counter() - started
                metrics.update(self.rollout_activity(metrics["timing/step"]))
                self.history.append(metrics)
                self.metrics.write(metrics)
                self.ledger.write({"step": step, "groups": self.context.take_trained()})
                self._print_progress(metrics)
                if not startup_clock.MARKS.get("first_step"):
                    startup_clock.mark("first_step")
                    if startup_clock.report_requested():
                        print(startup_clock.report(), file=sys.stderr, flush=True)
                held = self._checkpoint(step)
            if self.checkpointer is not None:
                self.checkpointer.close()
            self.pools.trainer.export_policy(f"{self.run_dir}/{POLICY_DIR}")
            publish_run_end(self.config.run.name, self.run_dir)
            return self.history
        finally:
            try:
                if self._context is not None:
                    self.on_train_end()
            finally:
                self.teardown()

    def step(self, step: int) -> dict[str, float]:
        """One global step: a Prefect sub-flow of phase tasks (``trainer.step_layout`` nested),
        phase tasks of the training flow run itself (flat), or the phases called directly."""
        if not self.config.trainer.use_prefect:
            return run_global_step(self, step, direct=True)
        if resolve_step_layout(self.config.trainer.step_layout) == "flat":
            return run_global_step(self, step, direct=False, label=f"step-{step}")
        with step_settings():
            # Prefect's Flow.__get__ binds the trainer at run time but keeps ``self`` in its type
            return self.global_step_flow(step)  # type: ignore[call-overload]

    @flow(
        name="global-step",
        flow_run_name=step_run_name,
        validate_parameters=False,
        log_prints=True,
        persist_result=False,  # a retried run re-runs its steps: never a stored result of the first try
    )
    def global_step_flow(self, step: int) -> dict[str, float]:
        return run_global_step(self, step, direct=False)

    def next_step_may_start(self, step: int) -> bool:
        """Whether step ``step + 1`` may begin generating as soon as step ``step``'s weights are
        synced: not after the last step, and not when a validation or a checkpoint follows this
        step (the replicas then validate first, and a checkpoint holds no generation in flight:
        a resumed sync run stays bitwise equal to one never stopped)."""
        if step >= self.config.trainer.total_steps or self._is_validation_step(step):
            return False
        return self.checkpointer is None or not self.checkpointer.due(step)

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
        activity = self.pools.rollout.pop_activity()
        busy = sum(a["busy_seconds"] for a in activity) / max(len(activity), 1)
        return {
            "rollout/busy_seconds": busy,
            "rollout/idle_fraction": max(0.0, 1.0 - busy / wall_seconds) if wall_seconds > 0 else 0.0,
            "rollout/groups_awaiting_tools": sum(a["groups_awaiting_tools"] for a in activity),
            # every replica's generated tokens over the step's wall time: what a slow grader
            # must not lower in the async modes (reward.streaming)
            "rollout/tokens_per_second": sum(a.get("generated_tokens", 0.0) for a in activity) / wall_seconds
            if wall_seconds > 0
            else 0.0,
            # requests per engine batch: a multi-turn loop's rounds are small unless batched
            "rollout/rows_per_engine_batch": sum(a["engine_rows"] for a in activity)
            / max(sum(a["engine_batches"] for a in activity), 1.0),
            # context tokens a turn after a tool did not prefill again (kept keys and values)
            "rollout/kv_reused_tokens": sum(a.get("kv_reused_tokens", 0.0) for a in activity),
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
        """Finish the checkpoint being written, close weight sync and kill the run's actors
        (idempotent). A write that cannot finish (a worker died) is logged, never committed.
        The last steps' artifacts still queued for the run's page are sent first."""
        wait_for_published()
        if self.checkpointer is not None:
            checkpointer, self.checkpointer = self.checkpointer, None
            try:
                checkpointer.close()
            except Exception as exc:  # the run's own error, if any, is the one to raise
                logger.warning("the last checkpoint was not committed: %s", exc)
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
