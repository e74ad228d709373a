"""The five observable boundaries of one weight sync (R-8.4), each timed.

0 quiesce (abort in-flight requests, release KV, keep weights), 1 export (training side:
gather, rename, cast), 2 transport, 3 receive into the engine, 4 recover (reset prefix
cache, resume KV, serve the new version). Each boundary raises its own error type, so a
failure names where it happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from rl_train.engines.weight_sync.base import NamedTensors, WeightReceiver, WeightSender


class WeightSyncError(RuntimeError):
    """Base of the boundary errors; ``boundary`` names where the sync failed."""

    boundary = "unknown"

    def __init__(self, message: str) -> None:
        super().__init__(f"weight sync failed at boundary '{self.boundary}': {message}")


class QuiesceError(WeightSyncError):
    boundary = "quiesce"


class ExportError(WeightSyncError):
    boundary = "export"


class TransportError(WeightSyncError):
    boundary = "transport"


class ReceiveError(WeightSyncError):
    boundary = "receive"


class RecoverError(WeightSyncError):
    boundary = "recover"


class SyncableRolloutEngine(Protocol):
    """The part of a rollout engine a weight sync touches."""

    def abort(self) -> int: ...

    def release_kv_cache(self) -> None: ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None: ...

    def reset_prefix_cache(self) -> None: ...

    def resume_kv_cache(self) -> None: ...


SparseUpdates = Iterable[tuple[str, torch.Tensor, torch.Tensor]]
"""(tensor name, flat int positions, new values) of entries to overwrite in place."""


def write_entries(dest: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Overwrite the flat positions ``index`` of ``dest`` with ``values``, in place, on ``dest``'s device."""
    dest.view(-1).index_copy_(0, index.to(dest.device, torch.long), values.to(dest.device, dest.dtype))


def accepts_sparse_updates(engine: object) -> bool:
    """Whether ``engine`` offers ``update_weights_sparse(updates: SparseUpdates, version)``.

    Optional: ``delta`` then writes only the changed entries into the engine's own weights,
    and its receiver keeps no mirror of the model; without it, ``delta`` keeps a mirror and
    hands the engine every changed tensor whole through ``update_weights``.
    """
    return callable(getattr(engine, "update_weights_sparse", None))


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
    sync_metrics = getattr(sender, "sync_metrics", None)
    if callable(sync_metrics):  # streaming senders report what actually went over the wire
        metrics.update(sync_metrics())
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
            load_into = getattr(named_tensors, "load_into", None)
            if callable(load_into):  # a receiver that knows a better way to load (sparse deltas)
                load_into(engine, version)
            else:
                engine.update_weights(named_tensors, version)
        except BaseException:
            close = getattr(named_tensors, "close", None)
            if callable(close):  # a streaming receiver skips the rest and tells the sender why
                close()
            raise
    with _boundary(metrics, "recover", RecoverError):
        engine.reset_prefix_cache()
        engine.resume_kv_cache()
    return metrics
