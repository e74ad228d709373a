"""Creating, finding and syncing the run's Ray actors.

Actors are named in a per-run namespace (``rl-train/<run_id>``) and created once per run;
every Prefect task of the run reaches them by name, so nothing but a run id crosses Prefect.
In sync mode all pools share the machine's CPUs (actors reserve 0 CPUs and alternate).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from rl_train.engines.weight_sync.base import build_weight_sync_backend
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.engines.workers.trainer_worker import TrainerWorker
from rl_train.storage.transfer_queue import TransferQueue


def run_namespace(run_id: str) -> str:
    return f"rl-train/{run_id}"


def ensure_ray(address: str | None, num_cpus: int | None) -> None:
    """Start a local Ray (or join ``address``) once per process. Never attaches to "auto"."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts workers at nice 15; the actors *are* the compute here, so without this the
    # driver's bookkeeping (Prefect's API server among it) preempts the training itself.
    os.environ.setdefault("RAY_worker_niceness", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING"}
    if address:
        if address == "auto":
            raise ValueError("ray.address 'auto' could attach to a foreign cluster; give an explicit address")
        ray.init(address=address, **kwargs)
        return
    temp_dir = os.environ.get("RL_TRAIN_RAY_TMPDIR")
    if temp_dir:
        kwargs["_temp_dir"] = temp_dir
    ray.init(num_cpus=num_cpus or os.cpu_count(), **kwargs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WorkerPools:
    run_id: str
    tq: Any
    rollouts: list[Any]
    trainers: list[Any]
    rewards: list[Any]

    @classmethod
    def create(cls, run_id: str, config: Any) -> WorkerPools:
        """Create every actor of the run (``config`` is the run's ``Config``)."""
        ns = run_namespace(run_id)
        common = {"namespace": ns, "num_cpus": 0, "lifetime": None}
        tq = ray.remote(TransferQueue).options(name="transfer-queue", **common).remote()
        model_path = str(config.model.path)
        rollouts = [
            ray.remote(RolloutWorker)
            .options(name=f"rollout-{i}", max_concurrency=2, **common)
            .remote(
                model_path,
                tq,
                config.run.seed + 1000 * i,
                config.rollout.num_threads,
                config.rollout.tool_env.model_dump(),
            )
            for i in range(config.rollout.num_replicas)
        ]
        world = config.actor.num_ranks
        address = f"127.0.0.1:{_free_port()}" if world > 1 else None
        trainers = [
            ray.remote(TrainerWorker)
            .options(name=f"trainer-{rank}", **common)
            .remote(
                rank,
                world,
                model_path,
                config.actor.model_dump(),
                config.optimizer_horizon_steps,
                config.rollout.temperature,
                config.run.seed,
                tq,
                address,
                config.actor.kl_loss or config.algorithm.kl_in_reward,  # needs the reference model
                config.rollout.tool_env.model_dump(),  # the spare rescue engine meets the same tools
            )
            for rank in range(world)
        ]
        rewards = [
            ray.remote(RewardWorker).options(name=f"reward-{i}", **common).remote(model_path, tq)
            for i in range(config.reward.num_workers)
        ]
        pools = cls(run_id, tq, rollouts, trainers, rewards)
        ray.get([t.ping.remote() for t in trainers])
        pools.open_weight_sync(config.rollout.weight_sync)
        return pools

    @classmethod
    def lookup(cls, run_id: str, num_rollouts: int, num_trainers: int, num_rewards: int) -> WorkerPools:
        ns = run_namespace(run_id)

        def get(name: str) -> Any:
            return ray.get_actor(name, namespace=ns)

        return cls(
            run_id,
            get("transfer-queue"),
            [get(f"rollout-{i}") for i in range(num_rollouts)],
            [get(f"trainer-{i}") for i in range(num_trainers)],
            [get(f"reward-{i}") for i in range(num_rewards)],
        )

    # -- weight sync ---------------------------------------------------------------------
    def open_weight_sync(self, cfg: Any) -> None:
        cfg = cfg.model_copy(update={"num_receivers": len(self.rollouts)})
        self.weight_sync_backend = build_weight_sync_backend(cfg)
        self.weight_sync_timeout = cfg.timeout_seconds
        descriptor = ray.get(self.trainers[0].open_sender.remote(self.weight_sync_backend))
        ray.get([r.open_receiver.remote(self.weight_sync_backend, descriptor) for r in self.rollouts])

    def sync_weights(self, version: int) -> dict[str, float]:
        """Push rank 0's weights to every rollout replica as ``version`` (R-8.5) and wait."""
        return self.start_weight_sync(version)()

    def start_weight_sync(self, version: int) -> Callable[[], dict[str, float]]:
        """Launch a push without waiting; call the returned function to wait for its metrics.

        Handover backends pass the sender's payload by object reference (never through
        this process); streaming backends run both ends concurrently.
        """
        payload_ref, metrics_ref = self.trainers[0].send_weights.options(num_returns=2).remote(version)
        payload = payload_ref if self.weight_sync_backend.handover else None
        receive_refs = [
            r.receive_weights.remote(payload, version, self.weight_sync_timeout) for r in self.rollouts
        ]

        def wait() -> dict[str, float]:
            metrics = dict(ray.get(metrics_ref))
            for replica_metrics in ray.get(receive_refs):
                for key, value in replica_metrics.items():
                    metrics[key] = max(metrics.get(key, 0.0), value)
            return metrics

        return wait

    def shutdown(self) -> None:
        for actor in (*self.rollouts, *self.trainers, *self.rewards, self.tq):
            ray.kill(actor, no_restart=True)
