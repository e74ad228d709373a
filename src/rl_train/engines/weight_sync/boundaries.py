"""The five observable boundaries of one weight sync (R-8.4), each timed.

0 quiesce (abort in-flight requests, release KV, keep weights), 1 export (training side:
gather, rename, cast), 2 transport, 3 receive into the engine, 4 recover (reset prefix
cache, resume KV, serve the new version). Each boundary raises its own error type
(``errors.py``), so a failure names where it happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rl_train.engines.weight_sync.base import (
    AbortableTensors,
    LoadsIntoEngine,
    NamedTensors,
    ReportsSyncMetrics,
    SparseUpdates,
    SyncableRolloutEngine,
    WeightReceiver,
    WeightSender,
    accepts_sparse_updates,
)
from rl_train.engines.weight_sync.delta_codec import write_entries
from rl_train.engines.weight_sync.errors import (
    ExportError,
    QuiesceError,
    ReceiveError,
    RecoverError,
    TransportError,
    WeightSyncError,
)

__all__ = [  # the errors and engine hooks were defined here first; importers may still find them here
    "ExportError",
    "QuiesceError",
    "ReceiveError",
    "RecoverError",
    "SparseUpdates",
    "SyncableRolloutEngine",
    "TransportError",
    "WeightSyncError",
    "accepts_sparse_updates",
    "run_receiver",
    "run_sender",
    "write_entries",
]

PREFIX = "timing/weight_sync/"


@contextmanager
def _boundary(metrics: dict[str, float], name: str, error: type[WeightSyncError]) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    except WeightSyncError:
        raise
    except Exception as exc:  # re-raised with the boundary named
        raise error(f"{type(exc).__name__}: {exc}") from exc
    finally:
        metrics[PREFIX + name] = metrics.get(PREFIX + name, 0.0) + time.perf_counter() - start


class _TimedExport:
    """Wraps the export iterator to time the export boundary apart from transport, and count bytes."""

    def __init__(self, export: Callable[[], NamedTensors], metrics: dict[str, float]) -> None:
        self._export = export
        self._metrics = metrics
        self.num_bytes = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        started = time.perf_counter()
        try:
            iterator = iter(self._export())
        except Exception as exc:
            raise ExportError(f"{type(exc).__name__}: {exc}") from exc
        self._add(started)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self._add(started)
                return
            except Exception as exc:
                raise ExportError(f"{type(exc).__name__}: {exc}") from exc
            self._add(started)
            self.num_bytes += item[1].numel() * item[1].element_size()
            yield item

    def _add(self, started: float) -> None:
        key = PREFIX + "export"
        self._metrics[key] = self._metrics.get(key, 0.0) + time.perf_counter() - started


def run_sender(
    sender: WeightSender, export: Callable[[], NamedTensors], version: int
) -> tuple[Any, dict[str, float]]:
    """Training side: export and transport. Returns (payload for receivers, metrics)."""
    metrics: dict[str, float] = {PREFIX + "export": 0.0}
    timed = _TimedExport(export, metrics)
    start = time.perf_counter()
    try:
        payload = sender.send(timed, version)
    except WeightSyncError:
        raise
    except Exception as exc:
        raise TransportError(f"{type(exc).__name__}: {exc}") from exc
    total = time.perf_counter() - start
    metrics[PREFIX + "transport"] = max(total - metrics[PREFIX + "export"], 0.0)
    metrics["weight_sync/bytes"] = float(timed.num_bytes)
    metrics["weight_sync/export_bytes"] = float(timed.num_bytes)
    if isinstance(sender, ReportsSyncMetrics):  # streaming senders report what went over the wire
        metrics.update(sender.sync_metrics())
    return payload, metrics


def run_receiver(
    engine: SyncableRolloutEngine,
    receiver: WeightReceiver,
    payload: Any,
    version: int,
    timeout_seconds: float,
) -> dict[str, float]:
    """Rollout side: quiesce, receive into the engine, recover. Returns the boundary timings."""
    metrics: dict[str, float] = {}
    with _boundary(metrics, "quiesce", QuiesceError):
        engine.abort()
        engine.release_kv_cache()
    with _boundary(metrics, "receive", ReceiveError):
        named_tensors, received_version = receiver.receive(payload, timeout_seconds)
        try:
            if received_version != version:
                raise ReceiveError(f"expected version {version}, the sender sent {received_version}")
            if isinstance(named_tensors, LoadsIntoEngine):  # it knows a better way (sparse deltas)
                named_tensors.load_into(engine, version)
            else:
                engine.update_weights(named_tensors, version)
        except BaseException:
            if isinstance(named_tensors, AbortableTensors):  # a stream skips the rest, tells the sender
                named_tensors.close()
            raise
    with _boundary(metrics, "recover", RecoverError):
        engine.reset_prefix_cache()
        engine.resume_kv_cache()
    return metrics
