"""The errors of a weight sync, one type per boundary (R-8.4).

They sit in a module of their own, with no imports, so that the low-level pieces (the wire
format, the bucket packer, the transports) can raise them without importing the
orchestration in ``boundaries.py`` that sits above them.
"""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """Base of the boundary errors; ``boundary`` names where the sync failed."""

    boundary = "unknown"

    def __init__(self, message: str) -> None:
        super().__init__(f"weight sync failed at boundary '{self.boundary}': {message}")
        self.reason = message
        """The message without the boundary prefix, for passing on to a peer."""


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


class WireFormatError(TransportError):
    """A frame on the control channel is malformed: wrong magic or version, a declared length
    over its cap, bad JSON, an unknown message or dtype, or sizes that do not add up."""


class PeerRefusedError(TransportError):
    """A peer did not prove the run's secret in the handshake (either end), or the sender refused this receiver."""


class IntegrityError(TransportError):
    """A sealed frame or a bucket failed its MAC check: forged, replayed, reordered or damaged."""
