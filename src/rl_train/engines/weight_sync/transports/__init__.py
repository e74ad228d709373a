"""Byte movers under the bucketed and delta backends: ``shm``, ``tcp``, ``torch_dist``, ``mooncake``."""

from rl_train.engines.weight_sync.transports.base import (
    TRANSPORTS,
    PlacesDirect,
    ReceiverTransport,
    SenderTransport,
    check_transport_available,
    get_transport,
)

__all__ = [
    "TRANSPORTS",
    "PlacesDirect",
    "ReceiverTransport",
    "SenderTransport",
    "check_transport_available",
    "get_transport",
]
