"""Both ends of a weight-sync backend in one process, feeding one rollout engine.

A run's ends live in two actors; a bench or a test that times or checks a real sync (export,
transport, load) without Ray builds them here instead: the receiver runs on a thread of its
own where the backend streams (both ends must run at once), in line where it hands over. The
thread lives as long as the link, as a rollout worker's does: a thread made per sync would
time its own start-up (torch's per-thread set-up, tens of ms) into every sync.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.base import NamedTensors, SyncableRolloutEngine
from rl_train.engines.weight_sync.boundaries import run_receiver, run_sender
from rl_train.engines.weight_sync.config import WeightSyncConfig


class LocalSyncLink:
    def __init__(self, cfg: WeightSyncConfig, engine: SyncableRolloutEngine) -> None:
        self.timeout_seconds = cfg.timeout_seconds
        self.backend = build_weight_sync_backend(cfg)
        self.sender = self.backend.build_sender()
        self.receiver = self.backend.build_receiver(self.sender.descriptor())
        self.engine = engine
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="weight-sync-receiver")

    def sync(self, export: Callable[[], NamedTensors], version: int) -> dict[str, float]:
        """One sync of what ``export`` yields as ``version``; the sender's metrics."""
        if self.backend.handover:
            payload, metrics = run_sender(self.sender, export, version)
            run_receiver(self.engine, self.receiver, payload, version, self.timeout_seconds)
            return metrics
        received = self._thread.submit(run_receiver, self.engine, self.receiver, None, version, self.timeout_seconds)
        try:
            _, metrics = run_sender(self.sender, export, version)
        finally:
            received.result()
        return metrics

    def close(self) -> None:
        self._thread.shutdown()
        self.receiver.close()
        self.sender.close()
