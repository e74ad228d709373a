"""The built-in weight-sync backends, as registered: factories of a sender and a receiver.

A backend is built in the driver (``build_weight_sync_backend``) and handed to the trainer and
rollout actors, which call ``build_sender`` / ``build_receiver`` in their own processes. The
ends move tensors and import torch; the factories do not, so that registering the backends,
checking a config against them and building one in the driver import no torch. Each end's
module is imported when an end is built, in the actor that builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_train.engines.weight_sync.base import WEIGHT_SYNC_BACKENDS
from rl_train.engines.weight_sync.config import WeightSyncConfig

if TYPE_CHECKING:
    from rl_train.engines.weight_sync.bucketed import BucketedReceiver, BucketedSender
    from rl_train.engines.weight_sync.delta import DeltaReceiver, DeltaSender
    from rl_train.engines.weight_sync.naive import NaiveReceiver, NaiveSender


@WEIGHT_SYNC_BACKENDS.register("naive")
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


@WEIGHT_SYNC_BACKENDS.register("bucketed")
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


@WEIGHT_SYNC_BACKENDS.register("delta")
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
