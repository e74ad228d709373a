"""The run's pools of Ray actors: created once per run, rejoined by run id.

One object per pool, each with its own launch and typed methods: the queue (``queue_pool``),
the rollout replicas (``rollout_pool``), the training ranks (``trainer_pool``), the reward
workers (``reward_pool``), the critic ranks (``critic_pool``), the teacher workers
(``teacher_pool``), and the weight sync between the
training and rollout pools (``weight_sync_link``). ``WorkerPools`` holds them for the flows
and tasks, and does only what spans several pools: launch and rejoin, ReMax's greedy
baseline, checkpoints, reviving replicas, teardown. Nothing above this package calls an
actor method by name or imports Ray.

Actors are named in a per-run namespace (``rl-train/<run_id>``). The queue actor keeps the
run's resolved config, so any process connected to the run's Ray cluster (a Prefect retry in
a fresh worker, say) rejoins every pool from the run id alone (``WorkerPools.join``). In sync
mode all pools share the machine's CPUs (actors reserve 0 CPUs and alternate).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import remove_placement_group

from rl_train.engines.workers.critic_pool import CriticPool, num_critic_ranks
from rl_train.engines.workers.critic_worker import CriticWorker
from rl_train.engines.workers.errors import RunGoneError
from rl_train.engines.workers.launched import ActorLauncher, LaunchedPools, kill_launched
from rl_train.engines.workers.pending import wait_all
from rl_train.engines.workers.placement import plan_placement, realize
from rl_train.engines.workers.queue_pool import QUEUE_ACTOR, QueuePool
from rl_train.engines.workers.queue_worker import GREEDY_PARTITION, QueueWorker
from rl_train.engines.workers.ray_start import ensure_ray
from rl_train.engines.workers.reward_pool import RewardPool
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.engines.workers.rollout_pool import RolloutPool
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.engines.workers.teacher_pool import TeacherPool, num_teacher_workers
from rl_train.engines.workers.teacher_worker import TeacherWorker
from rl_train.engines.workers.trainer_pool import TrainerPool
from rl_train.engines.workers.trainer_worker import TrainerWorker
from rl_train.engines.workers.weight_sync_link import PendingPush, WeightSyncLink

if TYPE_CHECKING:
    from rl_train.config import Config
    from rl_train.engines.workers.pending import RayPending
    from rl_train.storage.checkpoint_manifest import PartEntry

__all__ = ["PendingCheckpoint", "PendingPush", "WorkerClasses", "WorkerPools", "ensure_ray", "run_namespace"]


def run_namespace(run_id: str) -> str:
    return f"rl-train/{run_id}"


@dataclass
class WorkerClasses:
    """The actor classes of a run; a test may swap one for a subclass that records or fails."""

    queue: type = QueueWorker
    rollout: type = RolloutWorker
    trainer: type = TrainerWorker
    reward: type = RewardWorker
    critic: type = CriticWorker
    teacher: type = TeacherWorker


@dataclass
class PendingCheckpoint:
    """A checkpoint's parts being written by the workers: ``wait()`` returns their entries."""

    parts: list[RayPending[list[PartEntry]]]

    def wait(self) -> list[PartEntry]:
        return [entry for entries in wait_all(self.parts) for entry in entries]


@dataclass
class WorkerPools:
    run_id: str
    queue: QueuePool
    rollout: RolloutPool
    trainer: TrainerPool
    reward: RewardPool
    critic: CriticPool
    """Empty when the run has no critic."""
    teacher: TeacherPool = field(default_factory=TeacherPool)
    """Empty when the run's loss reads no teacher."""
    placement_groups: list[Any] = field(default_factory=list)
    """The placement groups of GPU pools and of ``ray.spread`` (removed at shutdown)."""
    weight_sync: WeightSyncLink = field(init=False)
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.weight_sync = WeightSyncLink(self.trainer, self.rollout, self.queue)

    @classmethod
    def create(cls, run_id: str, config: Config, classes: WorkerClasses | None = None) -> WorkerPools:
        """Create every actor of the run and wait until they are ready: ``launch`` then
        ``LaunchedPools.ready``. If anything fails half-way, the actors created so far are
        killed before raising, the half-opened weight sync closed first (a killed sender would
        leave its shared memory in /dev/shm for good)."""
        return cls.launch(run_id, config, classes).ready()

    @classmethod
    def launch(cls, run_id: str, config: Config, classes: WorkerClasses | None = None) -> LaunchedPools:
        """Ask Ray for every actor of the run and return without waiting for any of them: their
        processes start (import torch, load the model) while the caller does something else.
        ``ready()`` on the result waits for them; ``abandon()`` kills them. If asking fails
        half-way, the actors asked for so far are killed before raising."""
        classes = classes or WorkerClasses()
        launcher = ActorLauncher(run_namespace(run_id))
        placed = realize(plan_placement(config))
        groups = placed.groups
        try:
            queue = QueuePool.launch(launcher, classes.queue, config)
            queue_by_name = launcher.by_name(QUEUE_ACTOR)  # for actors Ray restarts (see named_actor)
            # the trainers first: the heaviest to start, and Ray starts only as many worker
            # processes at once as the node has CPUs
            trainer = TrainerPool.launch(launcher, classes.trainer, config, queue.actor, placed.trainers)
            # reward.streaming: each replica hands its finished groups to the reward workers
            scorers = [launcher.by_name(f"reward-{i}") for i in range(config.reward.num_workers)]
            streaming = scorers if config.reward.streaming else []
            # teacher.streaming: and to the teacher workers, sharded over the teacher pool apart
            teachers = [launcher.by_name(f"teacher-{i}") for i in range(num_teacher_workers(config.teacher.model_dump()))]
            teaching = teachers if config.teacher.streaming else []
            rollout = RolloutPool.launch(
                launcher, classes.rollout, config, queue_by_name, placed.rollouts, streaming, teaching
            )
            reward = RewardPool.launch(launcher, classes.reward, config, queue_by_name, placed.rewards)
            critic = CriticPool.launch(launcher, classes.critic, config, queue.actor)
            teacher = TeacherPool.launch(launcher, classes.teacher, config, queue_by_name, placed.teachers)
            pools = cls(run_id, queue, rollout, trainer, reward, critic, teacher, placement_groups=groups)
            return LaunchedPools(pools, config.rollout.weight_sync, launcher.created, groups)
        except BaseException:
            kill_launched(None, launcher.created, groups)
            raise

    @classmethod
    def join(cls, run_id: str) -> tuple[WorkerPools, dict[str, Any]]:
        """Rejoin a live run's actors by name from any process on its Ray cluster.

        Returns the pools and the run's resolved config (as data). A process not yet
        connected to Ray joins the cluster named by ``RAY_ADDRESS``; without it, or when the
        run's actors are gone, ``RunGoneError`` says so.
        """
        ns = run_namespace(run_id)
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            if not address or address == "auto":
                raise RunGoneError(
                    f"run {run_id!r}: this process is not connected to the run's Ray cluster; "
                    "set RAY_ADDRESS to its address (the run's ray.address) to rejoin it"
                )
            ensure_ray(address, None)
        try:
            queue = QueuePool.rejoin(ns)
            config = queue.run_config()
            pools = cls(
                run_id,
                queue,
                RolloutPool.rejoin(ns, config["rollout"]["num_replicas"]),
                TrainerPool.rejoin(ns, config["actor"]["num_ranks"]),
                RewardPool.rejoin(ns, config["reward"]["num_workers"]),
                CriticPool.rejoin(ns, num_critic_ranks(config["critic"])),
                TeacherPool.rejoin(ns, num_teacher_workers(config["teacher"])),
            )
        except (ValueError, ray.exceptions.RayActorError) as exc:
            raise RunGoneError(
                f"run {run_id!r}: its actors are gone from Ray namespace {ns!r} ({exc}); the run's "
                "driver has exited or been killed, so this task cannot rejoin it"
            ) from None
        pools.weight_sync.timeout_seconds = float(config["rollout"]["weight_sync"].get("timeout_seconds", 120.0))
        pools.weight_sync.handover = queue.weight_sync_handover()
        return pools, config

    # -- what spans several pools -------------------------------------------------------------
    def greedy_baselines(self, batch_id: str, max_new_tokens: int) -> dict[str, float]:
        """ReMax's baseline: one greedy answer per prompt of the batch, scored on the reward
        pool; each trajectory gets its prompt's as ``baseline_reward`` (the answers are then
        deleted, never trained on). Background generation holds meanwhile (the async modes)."""
        prompts = self.queue.stage_greedy_prompts(batch_id)
        params = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": max_new_tokens}
        self.rollout.pause_generation()
        try:
            greedy = self.rollout.generate(GREEDY_PARTITION, prompts, 1, params)
        finally:
            self.rollout.resume_generation()
        self.reward.score(GREEDY_PARTITION, greedy)
        return self.queue.set_baseline_rewards(batch_id, greedy)

    def start_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, with_policy: bool
    ) -> PendingCheckpoint:
        """Snapshot every stateful worker now, and start writing checkpoint ``step``'s parts.

        Returns once the training and critic ranks hold a host copy of their state (the next
        update may start); their writes run in each actor's checkpoint thread. The queue's
        table is taken in one call on the queue actor, ordered before anything this driver
        sends it next. ``PendingCheckpoint.wait()`` gives every part's manifest entry.
        """
        ranked = (self.trainer, self.critic)
        wait_all([call for pool in ranked for call in pool.start_checkpoint_snapshot(with_policy)])
        parts = [self.queue.start_checkpoint_write(root, step, storage_options)]
        parts += self.rollout.start_checkpoint_write(root, step, storage_options)
        for pool in ranked:
            parts += pool.start_checkpoint_write(root, step, storage_options)
        return PendingCheckpoint(parts)

    def load_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, version: int
    ) -> list[str]:
        """Restore every worker's part of checkpoint ``step``, then push the restored weights to
        the rollout replicas as ``version``. Returns the prompt keys put back to pending."""
        loads = self.trainer.start_checkpoint_load(root, step, storage_options)
        loads += self.critic.start_checkpoint_load(root, step, storage_options)
        loads += self.rollout.start_checkpoint_load(root, step, storage_options)
        requeued = self.queue.start_checkpoint_load(root, step, storage_options, version)
        wait_all(loads)
        self.weight_sync.sync(version)
        return list(requeued.wait())

    def revive_rollouts(self, version: int, wait_seconds: float = 120.0) -> list[int]:
        """Bring back rollout replicas that died: Ray restarts them (``max_restarts``), but a
        restarted replica serves the weights of ``model.path`` and has no weight-sync receiver.
        Weight sync is then reopened for every replica and ``version`` pushed, so all serve
        the trainer's weights again. Returns the indices of the replicas that had restarted."""
        current = self.rollout.current_incarnations(wait_seconds)
        known = self.rollout.known_incarnations
        restarted = [i for i, value in enumerate(current) if value != known[i]]
        if restarted:
            self.weight_sync.reopen()
            if self.trainer.pi_old_pinned:  # the current weights, past local update 0, go out as ``version``
                self.rollout.mark_next_push_off_version()
            self.weight_sync.sync(version)
            self.rollout.known_incarnations = current
        return restarted

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each training rank and rollout replica runs: ``{name: {"node_id", "ip"}}``."""
        placed = {f"trainer-{i}": where for i, where in enumerate(self.trainer.where())}
        placed.update({f"rollout-{i}": where for i, where in enumerate(self.rollout.where())})
        return placed

    def shutdown(self) -> None:
        """Close weight-sync endpoints (shared memory, sockets), then kill every actor.

        Safe to call twice and on a half-dead run: each step is attempted."""
        if self._closed:
            return
        self._closed = True
        self.weight_sync.close()
        for pool in (self.rollout, self.trainer, self.critic, self.reward, self.teacher, self.queue):
            pool.kill()
        for group in self.placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
