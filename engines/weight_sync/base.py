"""The weight-sync interface: a sender in the training process, receivers in rollout processes.

A sync of version v runs as: the training rank calls ``sender.send(named_tensors, v)``; each
rollout replica calls ``receiver.receive(payload, timeout)`` and hands the tensors it yields
to ``engine.update_weights(tensors, v)``. Streaming backends move bytes between the two
calls running concurrently and return ``None`` as payload; a *handover* backend
(``handover = True``) returns a payload that the orchestrator forwards to the receivers
(through the Ray object store, or by reference when both ends share a process).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import torch

from rl_train.registry import Registry

NamedTensors = Iterable[tuple[str, torch.Tensor]]


@runtime_checkable
class WeightSender(Protocol):
    def descriptor(self) -> dict[str, Any]:
        """Small, picklable: what a receiver needs to connect (names, ports, sizes)."""
        ...

    def send(self, named_tensors: NamedTensors, version: int) -> Any:
        """Move the tensors; return the payload for receivers (handover) or ``None``."""
        ...

    def close(self) -> None: ...


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


class WeightSyncBackend(Protocol):
    """A registered backend: a factory of the two ends."""

    handover: bool
    """True when ``send`` returns a payload the receivers need."""

    def build_sender(self) -> WeightSender: ...

    def build_receiver(self, descriptor: dict[str, Any]) -> WeightReceiver: ...


WEIGHT_SYNC_BACKENDS: Registry[type] = Registry("weight-sync backend")


def import_builtin_backends() -> None:
    """Import the built-in backends so that they register; heavy transports import lazily."""
    from rl_train.engines.weight_sync import bucketed, delta, naive  # noqa: F401


def build_weight_sync_backend(cfg: Any) -> WeightSyncBackend:
    """Instantiate the backend named by ``cfg.backend`` (a ``WeightSyncConfig``)."""
    import_builtin_backends()
    return WEIGHT_SYNC_BACKENDS.get(cfg.backend)(cfg)
