"""The weight sync between the pools (R-8.5): rank 0's sender, every rollout replica's receiver.

``open`` builds the configured backend and its endpoints; a push sends rank 0's weights to
every replica as a version. With ``overlap`` the push runs in the trainer's weight-sync
thread from a copy frozen in order with its other calls, beside the next step's work. A
handover backend passes the sender's payload to the receivers by object reference.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ray

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.workers.pending import RayPending, wait_all
from rl_train.engines.workers.queue_pool import QueuePool
from rl_train.engines.workers.rollout_pool import RolloutPool
from rl_train.engines.workers.trainer_pool import SYNC_GROUP, TrainerPool

if TYPE_CHECKING:
    from rl_train.engines.weight_sync.config import WeightSyncConfig

CLOSE_TIMEOUT_SECONDS = 30
"""Longest a closing endpoint is waited for (one already gone is skipped)."""


@dataclass
class PendingPush:
    """A weight push in flight: ``wait()`` returns its metrics (the sender's, max over receivers)."""

    metrics: RayPending[dict[str, float]]
    receives: list[RayPending[dict[str, float]]]
    peers: list[RayPending[None]] = field(default_factory=list)
    """The other model-parallel ranks' share of rank 0's export (a split model)."""

    def wait(self) -> dict[str, float]:
        metrics = dict(self.metrics.wait())
        wait_all(self.peers)
        for replica_metrics in wait_all(self.receives):
            for key, value in replica_metrics.items():
                metrics[key] = max(metrics.get(key, 0.0), value)
        return metrics


@dataclass
class WeightSyncLink:
    trainer: TrainerPool
    rollout: RolloutPool
    queue: QueuePool
    timeout_seconds: float = 120.0
    handover: bool = False
    """The backend hands the sender's payload to receivers by object reference."""
    config: WeightSyncConfig | None = None
    """The section last opened (``reopen`` opens it again)."""

    def open(self, config: WeightSyncConfig) -> None:
        """Build the backend for every replica, open rank 0's sender and each receiver."""
        self.config = config
        sized = config.model_copy(update={"num_receivers": len(self.rollout.replicas)})
        backend = build_weight_sync_backend(sized)
        self.timeout_seconds = sized.timeout_seconds
        self.handover = bool(backend.handover)
        descriptor = ray.get(self.trainer.rank0.open_sender.remote(backend))
        ray.get([actor.open_receiver.remote(backend, descriptor) for actor in self.rollout.actors])
        self.queue.set_weight_sync_handover(self.handover)

    def reopen(self) -> None:
        """Close every endpoint and open them again (a replica was restarted without its
        receiver); background generation goes on meanwhile."""
        if self.config is None:
            raise RuntimeError("the weight sync was never opened: nothing to reopen")
        self.close(final=False)
        self.open(self.config)

    def sync(self, version: int) -> dict[str, float]:
        """Push rank 0's weights to every replica as ``version`` and wait."""
        return self.start_push(version, overlap=False).wait()

    def start_push(self, version: int, overlap: bool = True) -> PendingPush:
        """Launch a push without waiting.

        ``overlap``: rank 0 first freezes a copy of the weights in its main thread, in order with
        its other calls, so the updates queued behind it cannot change what is sent; the transfer
        then runs in the actor's weight-sync thread. Without overlap the live weights are sent in
        the main thread (no copy). Handover backends pass the payload by object reference.
        """
        rank0 = self.trainer.rank0
        if overlap:
            rank0.freeze_weights.remote(version)
            send = rank0.send_weights.options(num_returns=2, concurrency_group=SYNC_GROUP)
        else:
            send = rank0.send_weights.options(num_returns=2)
        peers = self.trainer.start_peer_exports(sync=True)  # their main threads, as rank 0's export
        payload_ref, metrics_ref = send.remote(version, overlap)
        payload = payload_ref if self.handover else None
        receives = [
            RayPending[dict[str, float]](actor.receive_weights.remote(payload, version, self.timeout_seconds))
            for actor in self.rollout.actors
        ]
        return PendingPush(RayPending(metrics_ref), receives, peers)

    def close(self, final: bool = True) -> None:
        """Close every receiver and the sender; an endpoint already gone is skipped. Not
        ``final`` (to reopen them), background generation goes on."""
        closing = [actor.close_receiver.remote(final) for actor in self.rollout.actors]
        closing += [rank.close_sender.remote() for rank in self.trainer.ranks]
        for ref in closing:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref, timeout=CLOSE_TIMEOUT_SECONDS)
