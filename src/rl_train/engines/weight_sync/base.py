"""The weight-sync interface: a sender in the training process, receivers in rollout processes.

A sync of version v runs as: the training rank calls ``sender.send(named_tensors, v)``; each
rollout replica calls ``receiver.receive(payload, timeout)`` and hands the tensors it yields
to ``engine.update_weights(tensors, v)``. Streaming backends move bytes between the two
calls running concurrently and return ``None`` as payload; a *handover* backend
(``handover = True``) returns a payload that the orchestrator forwards to the receivers
(through the Ray object store, or by reference when both ends share a process).

Optional behaviour is declared here too, each hook as a small runtime-checkable Protocol
(``ReportsSyncMetrics``, ``AcceptsSparseUpdates``, ``LoadsIntoEngine``, ``AbortableTensors``):
callers test for the Protocol, never for a method name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the driver builds backends and never imports torch
    import torch

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]
SparseUpdates = Iterable[tuple[str, "torch.Tensor", "torch.Tensor"]]
"""(tensor name, flat int positions, new values) of entries to overwrite in place."""


@runtime_checkable
class WeightSender(Protocol):
    def descriptor(self) -> dict[str, Any]:
        """Small, picklable: what a receiver needs to connect (names, ports, sizes, the run's secret); it travels only through the trainer's own channel (Ray actor calls)."""
        ...

    def send(self, named_tensors: NamedTensors, version: int) -> Any:
        """Move the tensors; return the payload for receivers (handover) or ``None``."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ReportsSyncMetrics(Protocol):
    """Optional on a sender: what its last ``send`` moved over the wire (bytes, resyncs).

    ``run_sender`` counts the exported bytes itself; a sender that moves something else (a
    delta, a resync) says so here, and its figures win.
    """

    def sync_metrics(self) -> dict[str, float]: ...


@runtime_checkable
class WeightReceiver(Protocol):
    def receive(self, payload: Any, timeout_seconds: float) -> tuple[NamedTensors, int]:
        """The received (name, tensor) pairs and the version they carry.

        Streaming receivers lend each tensor until the next one is requested (it may be a
        view of a bucket buffer): the engine copies it into its own weights as it iterates,
        which is what ``update_weights`` does, and must not keep it.
        """
        ...

    def close(self) -> None: ...


class SyncableRolloutEngine(Protocol):
    """The part of a rollout engine a weight sync touches."""

    def abort(self) -> int: ...

    def release_kv_cache(self) -> None: ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None: ...

    def reset_prefix_cache(self) -> None: ...

    def resume_kv_cache(self) -> None: ...


@runtime_checkable
class AcceptsSparseUpdates(Protocol):
    """Optional on a rollout engine: overwrite only the given entries of its weights, in place.

    ``delta`` then writes only the changed entries into the engine's own weights, and its
    receiver keeps no mirror of the model; without it, ``delta`` keeps a mirror and hands
    the engine every changed tensor whole through ``update_weights``.
    """

    def update_weights_sparse(self, updates: SparseUpdates, version: int) -> None: ...


def accepts_sparse_updates(engine: object) -> bool:
    """Whether ``engine`` offers ``update_weights_sparse`` (``AcceptsSparseUpdates``)."""
    return isinstance(engine, AcceptsSparseUpdates)


@runtime_checkable
class LoadsIntoEngine(Protocol):
    """Optional on what ``receive`` returns: it knows a better way to load than ``update_weights``
    (a delta written sparsely, a stream that reports ``done`` once loaded)."""

    def load_into(self, engine: SyncableRolloutEngine, version: int) -> None: ...


@runtime_checkable
class AbortableTensors(Protocol):
    """Optional on what ``receive`` returns: called when the engine fails mid-load, so a
    streaming receiver skips the rest and tells the sender why."""

    def close(self) -> None: ...


class WeightSyncBackend(Protocol):
    """A registered backend: a factory of the two ends."""

    handover: bool
    """True when ``send`` returns a payload the receivers need."""
    uses_transport: bool
    """True when it moves bytes over ``rollout.weight_sync.transport`` (checked at config load)."""

    def build_sender(self) -> WeightSender: ...

    def build_receiver(self, descriptor: dict[str, Any]) -> WeightReceiver: ...

