"""The weight-sync backends (``rollout.weight_sync.backend``): factories of a sender and a
receiver, in the ``WEIGHT_SYNC_BACKENDS`` table.

A backend is built in the driver (``build_weight_sync_backend``) and handed to the trainer and
rollout actors, which call ``build_sender`` / ``build_receiver`` in their own processes. The
ends move tensors and import torch; the factories do not, so that checking a config against
the table and building a backend in the driver import no torch. Each end's module is
imported when an end is built, in the actor that builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.engines.weight_sync.base import WeightSyncBackend
    from rl_train.engines.weight_sync.bucketed import BucketedReceiver, BucketedSender
    from rl_train.engines.weight_sync.config import WeightSyncConfig
    from rl_train.engines.weight_sync.delta import DeltaReceiver, DeltaSender
    from rl_train.engines.weight_sync.naive import NaiveReceiver, NaiveSender


class BackendClass(Protocol):
    """A backend class as the table holds it: what it declares before one is built (the config
    check reads ``uses_transport``), and its constructor."""

    handover: bool
    """True when ``send`` returns a payload the receivers need."""
    uses_transport: bool
    """True when it moves bytes over ``rollout.weight_sync.transport`` (checked at config load)."""

    def __call__(self, cfg: WeightSyncConfig) -> WeightSyncBackend: ...


class NaiveBackend:
    """``naive``: the whole state handed over in one piece (``naive.py``)."""

    handover = True
    uses_transport = False

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    def build_sender(self) -> NaiveSender:
        from rl_train.engines.weight_sync.naive import NaiveSender

        return NaiveSender()

    def build_receiver(self, descriptor: dict[str, Any]) -> NaiveReceiver:
        from rl_train.engines.weight_sync.naive import NaiveReceiver

        return NaiveReceiver()


class BucketedBackend:
    """``bucketed``: the full weights streamed in fixed-size buckets (``bucketed.py``)."""

    handover = False
    uses_transport = True

    def __init__(self, cfg: WeightSyncConfig) -> None:
        self.cfg = cfg

    def build_sender(self) -> BucketedSender:
        from rl_train.engines.weight_sync.bucketed import BucketedSender

        return BucketedSender(self.cfg)

    def build_receiver(self, descriptor: dict[str, Any]) -> BucketedReceiver:
        from rl_train.engines.weight_sync.bucketed import BucketedReceiver

        return BucketedReceiver(descriptor, self.cfg.timeout_seconds)


class DeltaBackend:
    """``delta``: only the entries that changed since the last sync (``delta.py``)."""

    handover = False
    uses_transport = True

    def __init__(self, cfg: WeightSyncConfig) -> None:
        self.cfg = cfg

    def build_sender(self) -> DeltaSender:
        from rl_train.engines.weight_sync.delta import DeltaSender

        return DeltaSender(self.cfg)

    def build_receiver(self, descriptor: dict[str, Any]) -> DeltaReceiver:
        from rl_train.engines.weight_sync.delta import DeltaReceiver

        return DeltaReceiver(descriptor, self.cfg.timeout_seconds)


WEIGHT_SYNC_BACKENDS: Registry[Entry[BackendClass]] = Registry(
    "weight-sync backend",
    "rollout.weight_sync.backend",
    {
        "naive": Entry(
            NaiveBackend,
            "the whole state handed over in one piece: through Ray's object store between actors, "
            "by reference within one process.",
        ),
        "bucketed": Entry(
            BucketedBackend, "the full weights streamed in fixed-size buckets over `rollout.weight_sync.transport`."
        ),
        "delta": Entry(
            DeltaBackend, "only the entries that changed since the last sync, over `rollout.weight_sync.transport`."
        ),
    },
)


def build_weight_sync_backend(cfg: WeightSyncConfig) -> WeightSyncBackend:
    """Instantiate the backend named by ``cfg.backend``."""
    return WEIGHT_SYNC_BACKENDS.get(cfg.backend)(cfg)
