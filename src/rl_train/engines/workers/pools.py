"""Creating, joining and driving the run's Ray actors.

Actors are named in a per-run namespace (``rl-train/<run_id>``) and created once per run.
The queue actor keeps the run's resolved config, so any process connected to the run's Ray
cluster (a Prefect retry in a fresh worker, say) rejoins every pool from the run id alone
(``WorkerPools.join``). Flows and tasks drive the pools only through the typed methods here;
nothing above this module calls an actor method by name or imports Ray.
In sync mode all pools share the machine's CPUs (actors reserve 0 CPUs and alternate).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from rl_train.engines.weight_sync.base import build_weight_sync_backend
from rl_train.engines.workers.critic_worker import CriticWorker
from rl_train.engines.workers.errors import RunGoneError
from rl_train.engines.workers.launched import LaunchedPools, kill_launched
from rl_train.engines.workers.named_actor import NamedActor
from rl_train.engines.workers.placement import plan_placement, realize
from rl_train.engines.workers.queue_worker import GREEDY_PARTITION, QueueWorker
from rl_train.engines.workers.ray_start import ensure_ray
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.engines.workers.rollout_control import RolloutControl
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.engines.workers.trainer_worker import TrainerWorker

QUEUE_ACTOR = "transfer-queue"
SYNC_GROUP = "weight_sync"
"""The trainer actors' concurrency group for pushes: a push runs beside the next step's work."""
ROLLOUT_MAX_RESTARTS = 3
"""A rollout replica that dies is restarted by Ray, then reloaded by ``revive_rollouts``."""
REWARD_MAX_RESTARTS = 3
"""A reward worker holds no state: Ray restarts it and the retried reward task goes on."""
CHECKPOINT_GROUP = "checkpoint"
"""The training and critic actors' group for checkpoint writes, beside the next step's work."""


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


@dataclass
class PendingPush:
    """A weight push in flight: ``wait()`` returns its metrics (the sender's, max over receivers)."""

    metrics_ref: Any
    receive_refs: list[Any]
    peer_refs: list[Any] = field(default_factory=list)
    """The other model-parallel ranks' share of rank 0's export (a split model)."""

    def wait(self) -> dict[str, float]:
        metrics = dict(ray.get(self.metrics_ref))
        ray.get(self.peer_refs)
        for replica_metrics in ray.get(self.receive_refs):
            for key, value in replica_metrics.items():
                metrics[key] = max(metrics.get(key, 0.0), value)
        return metrics


@dataclass
class PendingCheckpoint:
    """A checkpoint's parts being written by the workers: ``wait()`` returns their entries."""

    refs: list[Any]

    def wait(self) -> list[Any]:
        return [entry for entries in ray.get(self.refs) for entry in entries]


def _wait(refs: list[Any]) -> list[Any]:
    return ray.get(refs)


@dataclass
class WorkerPools(RolloutControl):
    run_id: str
    tq: Any
    rollouts: list[Any]
    trainers: list[Any]
    rewards: list[Any]
    critics: list[Any] = field(default_factory=list)
    """The critic pool (its own DP ranks); empty when the run has no critic."""
    weight_sync_timeout: float = 120.0
    handover: bool = False
    """The backend hands the sender's payload to receivers by object reference."""
    _closed: bool = field(default=False, repr=False)
    _incarnations: list[str] = field(default_factory=list, repr=False)
    _pi_old_pinned: bool = field(default=False, repr=False)
    """Between ``snapshot_pi_old`` and ``clear_pi_old``: the trainer's weights have moved past
    the version the replicas are tagged with."""
    """Each rollout replica's incarnation when last seen: a different one means Ray restarted it."""
    _sync_cfg: Any = field(default=None, repr=False)
    _placement_groups: list[Any] = field(default_factory=list, repr=False)
    """The placement groups of GPU pools and of ``ray.spread`` (removed at shutdown)."""
    _dp_ranks: list[int] = field(default_factory=list, repr=False)
    """Each training rank's data-parallel index: the ranks that split one model share a batch shard."""
    _split_model: bool = field(default=False, repr=False)
    """The model is split over the training ranks (tensor or pipeline parallel): every export of
    rank 0 is a collective that the other ranks join."""

    def warm_up(self) -> None:
        """Ask the queue to build, on a thread of its own, what it first needs after the first
        batch is generated (fire and forget: a failure shows at first use)."""
        self.tq.warm_up.remote()

    @property
    def export_peers(self) -> list[Any]:
        """The training ranks that join rank 0's exports (none unless the model is split)."""
        return self.trainers[1:] if self._split_model else []

    def _by_data_rank(self, shards: list[Any]) -> list[tuple[Any, Any]]:
        """(rank, its shard): a shard per data-parallel index, shared by the ranks of one model."""
        dp_ranks = self._dp_ranks or list(range(len(self.trainers)))
        return [(rank, shards[dp]) for rank, dp in zip(self.trainers, dp_ranks, strict=True)]

    @classmethod
    def create(cls, run_id: str, config: Any, classes: WorkerClasses | None = None) -> WorkerPools:
        """Create every actor of the run (``config`` is the run's ``Config``) and wait until
        they are ready: ``launch`` then ``LaunchedPools.ready``.

        If anything fails half-way, the actors created so far are killed before raising, and
        a weight sync that was half opened is closed first: a killed sender would leave its
        shared memory in /dev/shm for good.
        """
        return cls.launch(run_id, config, classes).ready()

    @classmethod
    def launch(cls, run_id: str, config: Any, classes: WorkerClasses | None = None) -> LaunchedPools:
        """Ask Ray for every actor of the run and return without waiting for any of them: their
        processes start (import torch, load the model) while the caller does something else.
        ``ready()`` on the result waits for them; ``abandon()`` kills them. If asking fails
        half-way, the actors asked for so far are killed before raising."""
        classes = classes or WorkerClasses()
        ns = run_namespace(run_id)
        common: dict[str, Any] = {"namespace": ns, "num_cpus": 0, "lifetime": None}
        trainer_places, rollout_places, groups = realize(plan_placement(config))
        created: list[Any] = []
        pools: WorkerPools | None = None

        def make(
            actor_cls: type, name: str, *args: Any, groups: dict[str, int] | None = None, **options: Any
        ) -> Any:
            remote_cls = ray.remote(concurrency_groups=groups)(actor_cls) if groups else ray.remote(actor_cls)
            handle = remote_cls.options(name=name, **common, **options).remote(*args)
            created.append(handle)
            return handle

        try:
            tq = make(classes.queue, QUEUE_ACTOR, config.model_dump(mode="json"))
            queue_by_name = NamedActor(QUEUE_ACTOR, ns)  # for actors Ray restarts (see named_actor)
            model_path = str(config.model.path)
            tool_env = config.rollout.tool_env.model_dump()
            rollout_options = config.rollout.engine_options(config.model.impl)
            # the trainers first: the heaviest to start, and Ray starts only as many worker
            # processes at once as the node has CPUs
            world = config.actor.num_ranks
            trainers = [
                make(
                    classes.trainer,
                    f"trainer-{rank}",
                    rank,
                    world,
                    model_path,
                    config.actor.model_dump(),
                    config.optimizer_horizon_steps,
                    config.rollout.temperature,
                    config.run.seed,
                    tq,
                    None,  # joined below, at rank 0's address
                    config.actor.kl_loss or config.algorithm.kl_in_reward,  # needs the reference model
                    tool_env,  # the spare rescue engine meets the same tools
                    config.rollout.engine,
                    rollout_options,
                    config.model.impl,
                    config.rollout.agent.model_dump(),
                    groups={SYNC_GROUP: 1, CHECKPOINT_GROUP: 1},
                    **trainer_places[rank],
                )
                for rank in range(world)
            ]
            rollouts = [
                make(
                    classes.rollout,
                    f"rollout-{i}",
                    model_path,
                    queue_by_name,
                    config.run.seed + 1000 * i,
                    config.rollout.num_threads,
                    tool_env,
                    config.rollout.engine,
                    rollout_options,
                    config.rollout.device,
                    config.rollout.agent.model_dump(),
                    max_concurrency=2,
                    max_restarts=ROLLOUT_MAX_RESTARTS,
                    **rollout_places[i],
                )
                for i in range(config.rollout.num_replicas)
            ]
            rewards = [
                make(classes.reward, f"reward-{i}", model_path, queue_by_name, max_restarts=REWARD_MAX_RESTARTS)
                for i in range(config.reward.num_workers)
            ]
            num_critics = num_critic_ranks(config.critic.model_dump())
            critics = [
                make(
                    classes.critic,
                    f"critic-{rank}",
                    rank,
                    num_critics,
                    model_path,
                    config.critic.model_dump(),
                    config.run.seed,
                    tq,
                    None,  # joined below, at rank 0's address
                    groups={CHECKPOINT_GROUP: 1},
                )
                for rank in range(num_critics)
            ]
            split = config.actor.megatron.tensor_parallel_size * config.actor.megatron.pipeline_parallel_size
            split_model = split > 1 or (config.actor.fsdp and world > 1)  # exports gather over the ranks
            pools = cls(
                run_id, tq, rollouts, trainers, rewards, critics, _placement_groups=groups, _split_model=split_model
            )
            return LaunchedPools(pools, config.rollout.weight_sync, created, groups)
        except BaseException:
            kill_launched(pools, created, groups)
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
            tq = ray.get_actor(QUEUE_ACTOR, namespace=ns)
            config = ray.get(tq.run_config.remote())
            get = lambda name: ray.get_actor(name, namespace=ns)  # noqa: E731
            pools = cls(
                run_id,
                tq,
                [get(f"rollout-{i}") for i in range(config["rollout"]["num_replicas"])],
                [get(f"trainer-{i}") for i in range(config["actor"]["num_ranks"])],
                [get(f"reward-{i}") for i in range(config["reward"]["num_workers"])],
                [get(f"critic-{i}") for i in range(num_critic_ranks(config["critic"]))],
            )
        except (ValueError, ray.exceptions.RayActorError) as exc:
            raise RunGoneError(
                f"run {run_id!r}: its actors are gone from Ray namespace {ns!r} ({exc}); the run's "
                "driver has exited or been killed, so this task cannot rejoin it"
            ) from None
        sync = config["rollout"]["weight_sync"]
        pools.weight_sync_timeout = float(sync.get("timeout_seconds", 120.0))
        pools.handover = bool(ray.get(tq.weight_sync_handover.remote()))
        return pools, config

    # -- phases that run on the pools --------------------------------------------------------
    def batch(self, batch_id: str, fields: list[str] | None = None) -> dict[str, Any]:
        """A batch's metadata (``keys``, ``groups``, ``shards``, ...): only ``fields`` if given."""
        return dict(ray.get(self.tq.get_batch.remote(batch_id, fields)))

    def score(self, partition: str, keys: list[str]) -> list[float]:
        """Rewards of ``keys`` on the reward pool (written onto the records), in key order."""
        shards = _split(keys, len(self.rewards))
        parts = _wait([w.score.remote(partition, s) for w, s in zip(self.rewards, shards, strict=True) if s])
        return [s for part in parts for s in part]

    def balance(self, batch_id: str) -> dict[str, float]:
        """Split the batch across DP ranks by tokens, in the queue actor."""
        parts = max(self._dp_ranks, default=len(self.trainers) - 1) + 1
        return dict(ray.get(self.tq.balance_batch.remote(batch_id, parts)))

    def compute_log_probs(
        self, batch_id: str, out_field: str, reference: bool, shards: list[list[str]] | None = None
    ) -> None:
        """A forward-only pass on every training rank over its shard of the batch (``shards``:
        the balanced ones, or what is left of them)."""
        if shards is None:
            shards = self.batch(batch_id, ["shards"])["shards"]
        _wait(
            [
                rank.compute_log_probs.remote("train", shard, out_field, reference)
                for rank, shard in self._by_data_rank(shards)
            ]
        )

    def copy_current_log_probs(self, batch_id: str) -> tuple[list[list[str]], dict[str, float]]:
        """``bypass_current_version``: pi_old := the rollout log-probs of the trajectories that
        pi_old's weights sampled wholly, inside the queue actor; returns the shards left to
        recompute and the share copied."""
        shards, metrics = ray.get(self.tq.copy_current_log_probs.remote(batch_id))
        return shards, dict(metrics)

    def copy_rollout_log_probs(self, batch_id: str) -> None:
        """Bypass mode (R-7.1): pi_old := the rollout log-probs, copied inside the queue actor."""
        ray.get(self.tq.copy_rollout_log_probs.remote(batch_id))

    def compute_advantages(self, batch_id: str) -> dict[str, float]:
        """Rollout correction, token rewards and advantages, computed inside the queue actor."""
        return dict(ray.get(self.tq.compute_advantages.remote(batch_id)))

    def greedy_baselines(self, batch_id: str, max_new_tokens: int) -> dict[str, float]:
        """ReMax's baseline: one greedy answer per prompt of the batch, scored on the reward
        pool; each trajectory gets its prompt's as ``baseline_reward`` (the answers are then
        deleted, never trained on). Background generation holds meanwhile (the async modes)."""
        prompts = ray.get(self.tq.stage_greedy_prompts.remote(batch_id))
        params = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": max_new_tokens}
        self.pause_generation()
        try:
            greedy = self.generate(GREEDY_PARTITION, prompts, 1, params)
        finally:
            self.resume_generation()
        self.score(GREEDY_PARTITION, greedy)
        return dict(ray.get(self.tq.set_baseline_rewards.remote(batch_id, greedy)))

    def compute_values(self, batch_id: str) -> None:
        """Critic values (V_old) of the batch, spread over the critic ranks, written on the records."""
        shards = _split(self.batch(batch_id, ["keys"])["keys"], len(self.critics))
        _wait(
            [
                rank.compute_values.remote("train", shard)
                for rank, shard in zip(self.critics, shards, strict=True)
            ]
        )

    def update_critic(self, batch_id: str, num_mini_batches: int) -> dict[str, float]:
        """Critic update on every critic rank (the same number of steps each); metrics are the mean over ranks."""
        shards = _split(self.batch(batch_id, ["keys"])["keys"], len(self.critics))
        per_rank = _wait(
            [
                rank.update.remote("train", shard, num_mini_batches)
                for rank, shard in zip(self.critics, shards, strict=True)
            ]
        )
        return _mean_over_ranks(per_rank)

    def update(self, batch_id: str, num_mini_batches: int) -> dict[str, float]:
        """Actor update on every DP rank; metrics are the mean over ranks."""
        shards = self.batch(batch_id, ["shards"])["shards"]
        per_rank = _wait(
            [
                rank.update.remote("train", shard, num_mini_batches)
                for rank, shard in self._by_data_rank(shards)
            ]
        )
        return _mean_over_ranks(per_rank)

    def generate(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        """Blocking generation of ``keys`` spread over the replicas; returns the trajectory keys."""
        shards = _split(keys, len(self.rollouts))
        parts = _wait(
            [
                r.generate_prompts.remote(partition, s, n, params)
                for r, s in zip(self.rollouts, shards, strict=True)
                if s
            ]
        )
        return [k for part in parts for k in part]

    def put_records(self, partition: str, records: dict[str, dict[str, Any]], tags: dict[str, Any]) -> None:
        ray.get(self.tq.put.remote(partition, records, tags))

    def delete_records(self, partition: str, keys: list[str]) -> None:
        ray.get(self.tq.delete.remote(partition, keys))

    # -- separate_async: pi_old and the spare engine ---------------------------------------
    def snapshot_pi_old(self) -> None:
        _wait([rank.snapshot_pi_old.remote() for rank in self.trainers])
        self._pi_old_pinned = True

    def clear_pi_old(self) -> None:
        _wait([rank.clear_pi_old.remote() for rank in self.trainers])
        self._pi_old_pinned = False

    def rescue_generate(self, keys: list[str], n: int, params: dict[str, Any], version: int) -> None:
        peers = [peer.join_export.remote() for peer in self.export_peers]
        ray.get(self.trainers[0].rescue_generate.remote("train", keys, n, params, version))
        ray.get(peers)

    # -- checkpoint (R-9.2, R-9.3) -----------------------------------------------------------
    def start_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, with_policy: bool
    ) -> PendingCheckpoint:
        """Snapshot every stateful worker now, and start writing checkpoint ``step``'s parts.

        Returns once the training and critic ranks hold a host copy of their state (the next
        update may start); their writes run in each actor's checkpoint thread. The queue's
        table is taken in one call on the queue actor, ordered before anything this driver
        sends it next. ``PendingCheckpoint.wait()`` gives every part's manifest entry.
        """
        ranks = [*self.trainers, *self.critics]
        _wait([rank.snapshot_checkpoint.remote(with_policy) for rank in ranks])
        refs = [self.tq.save_checkpoint.remote(root, step, storage_options)]
        refs += [
            replica.save_checkpoint.remote(root, step, storage_options, i) for i, replica in enumerate(self.rollouts)
        ]
        refs += [
            rank.write_checkpoint.options(concurrency_group=CHECKPOINT_GROUP).remote(root, step, storage_options)
            for rank in ranks
        ]
        return PendingCheckpoint(refs)

    def load_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, version: int
    ) -> list[str]:
        """Restore every worker's part of checkpoint ``step``, then push the restored weights to
        the rollout replicas as ``version``. Returns the prompt keys put back to pending."""
        refs = [rank.load_checkpoint.remote(root, step, storage_options) for rank in (*self.trainers, *self.critics)]
        refs += [r.load_checkpoint.remote(root, step, storage_options, i) for i, r in enumerate(self.rollouts)]
        requeued = self.tq.load_checkpoint.remote(root, step, storage_options, version)
        _wait(refs)
        self.sync_weights(version)
        return list(ray.get(requeued))

    def export_policy(self, uri: str) -> list[str]:
        """The policy as an HF model directory at ``uri`` (rank 0 holds the whole model)."""
        peers = [peer.join_export.remote() for peer in self.export_peers]
        files = list(ray.get(self.trainers[0].export_policy.remote(uri)))
        ray.get(peers)
        return files

    # -- weight sync -------------------------------------------------------------------------
    def revive_rollouts(self, version: int, wait_seconds: float = 120.0) -> list[int]:
        """Bring back rollout replicas that died: Ray restarts them (``max_restarts``), but a
        restarted replica serves the weights of ``model.path`` and has no weight-sync receiver.
        Weight sync is then reopened for every replica and ``version`` pushed, so all serve
        the trainer's weights again. Returns the indices of the replicas that had restarted."""
        deadline = time.monotonic() + wait_seconds
        current: list[str] = []
        for i, replica in enumerate(self.rollouts):
            while True:
                try:
                    current.append(ray.get(replica.incarnation.remote(), timeout=max(deadline - time.monotonic(), 1.0)))
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:  # restarting
                    if time.monotonic() > deadline:
                        raise RunGoneError(
                            f"rollout replica {i} died and did not come back within {wait_seconds:.0f}s "
                            f"(it restarts at most {ROLLOUT_MAX_RESTARTS} times): {exc}"
                        ) from exc
                    time.sleep(0.5)
        restarted = [i for i, value in enumerate(current) if value != self._incarnations[i]]
        if restarted:
            self._close_weight_sync(final=False)
            self.open_weight_sync(self._sync_cfg)
            if self._pi_old_pinned:  # the current weights, past local update 0, go out as ``version``
                _wait([r.mark_next_push_off_version.remote() for r in self.rollouts])
            self.sync_weights(version)
            self._incarnations = current
        return restarted

    def open_weight_sync(self, cfg: Any) -> None:
        self._sync_cfg = cfg
        cfg = cfg.model_copy(update={"num_receivers": len(self.rollouts)})
        backend = build_weight_sync_backend(cfg)
        self.weight_sync_timeout = cfg.timeout_seconds
        self.handover = bool(backend.handover)
        descriptor = ray.get(self.trainers[0].open_sender.remote(backend))
        _wait([r.open_receiver.remote(backend, descriptor) for r in self.rollouts])
        ray.get(self.tq.set_weight_sync_handover.remote(self.handover))

    def sync_weights(self, version: int) -> dict[str, float]:
        """Push rank 0's weights to every rollout replica as ``version`` (R-8.5) and wait."""
        return self.start_weight_sync(version, overlap=False).wait()

    def start_weight_sync(self, version: int, overlap: bool = True) -> PendingPush:
        """Launch a push without waiting.

        ``overlap``: the push runs beside the next step's work. Rank 0 first freezes a copy of
        the weights in its main thread, in order with its other calls, so the updates queued
        behind it cannot change what is sent; the transfer then runs in the actor's
        weight-sync thread. Without overlap the live weights are sent in the main thread (no
        copy). Handover backends pass the payload by object reference, never through here.
        """
        rank0 = self.trainers[0]
        if overlap:
            rank0.freeze_weights.remote(version)
            send = rank0.send_weights.options(num_returns=2, concurrency_group=SYNC_GROUP)
        else:
            send = rank0.send_weights.options(num_returns=2)
        peers = [peer.join_export.remote() for peer in self.export_peers]  # their main threads, as rank 0's export
        payload_ref, metrics_ref = send.remote(version, overlap)
        payload = payload_ref if self.handover else None
        receive_refs = [
            r.receive_weights.remote(payload, version, self.weight_sync_timeout) for r in self.rollouts
        ]
        return PendingPush(metrics_ref, receive_refs, peers)

    # -- teardown ----------------------------------------------------------------------------
    def _close_weight_sync(self, final: bool = True) -> None:
        """Close every receiver and the sender; an endpoint already gone is skipped. Not
        ``final`` (to reopen them), background generation goes on."""
        closing = [r.close_receiver.remote(final) for r in self.rollouts]
        closing += [t.close_sender.remote() for t in self.trainers]
        for ref in closing:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref, timeout=30)

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each training rank and rollout replica runs: ``{name: {"node_id", "ip"}}``."""
        named = {f"trainer-{i}": t for i, t in enumerate(self.trainers)}
        named.update({f"rollout-{i}": r for i, r in enumerate(self.rollouts)})
        return dict(zip(named, ray.get([actor.where.remote() for actor in named.values()]), strict=True))

    def shutdown(self) -> None:
        """Close weight-sync endpoints (shared memory, sockets), then kill every actor.

        Safe to call twice and on a half-dead run: each step is attempted."""
        if self._closed:
            return
        self._closed = True
        self._close_weight_sync()
        for actor in (*self.rollouts, *self.trainers, *self.critics, *self.rewards, self.tq):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for group in self._placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)


def num_critic_ranks(critic: dict[str, Any]) -> int:
    """Actors of the critic pool, from a ``critic`` config section as data (0: no critic)."""
    return int(critic["num_ranks"]) if critic["enable"] else 0


def _split(keys: list[str], parts: int) -> list[list[str]]:
    return [keys[i::parts] for i in range(parts)]


def _mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for metrics in per_rank for k in metrics}
    return {
        k: sum(m[k] for m in per_rank if k in m) / max(sum(k in m for m in per_rank), 1) for k in sorted(keys)
    }
