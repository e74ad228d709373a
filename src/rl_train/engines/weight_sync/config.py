"""``rollout.weight_sync.*``: which backend moves weights, over which transport, and its knobs.

Availability is checked here, at config load: a transport whose package is missing fails
with its install hint before any worker starts, never in the middle of a run.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.weight_sync.backends import WEIGHT_SYNC_BACKENDS
from rl_train.engines.weight_sync.transports import TransportName, check_transport_available


class WeightSyncConfig(StrictModel):
    backend: Annotated[str, AfterValidator(WEIGHT_SYNC_BACKENDS.check)] = "naive"
    """Registered weight-sync backend (rl_train.engines.weight_sync.WEIGHT_SYNC_BACKENDS)."""
    timeout_seconds: float = Field(default=120.0, gt=0)
    """Longest any blocking wait of a sync may take before it fails naming its boundary."""
    transport: TransportName = "shm"
    """Byte mover under `bucketed` and `delta`: shared memory (one host), TCP, torch.distributed, Mooncake."""
    bucket_size_bytes: int = Field(default=64 << 20, ge=4096)
    """Size of each of the two alternating bucket buffers; memory per side is about twice this."""
    num_receivers: int = Field(default=1, ge=1)
    """Rollout replicas that receive every sync (the flow sets it to the rollout pool size)."""
    host: str | None = None
    """Address the sender listens on and receivers dial (None: the address of the node the sender runs on)."""
    delta_entries_per_flush: int = Field(default=1 << 20, ge=1)
    """`delta`: changed (index, value) entries per flush; flushes go by count, never by bytes (R-8.3)."""
    delta_threads: int = Field(default=2, ge=1)
    """`delta`: sender threads that diff each export against the snapshot (a sync-time cost only)."""
    delta_snapshot: Literal["host", "device"] = "host"
    """`delta`: where the sender's snapshot lives; `device` diffs on the GPU, costing one model copy there."""

    @model_validator(mode="after")
    def _check_available(self) -> WeightSyncConfig:
        if WEIGHT_SYNC_BACKENDS.get(self.backend).uses_transport:
            try:
                check_transport_available(self.transport)
            except ValueError as exc:
                raise ValueError(f"rollout.weight_sync.transport: {exc}") from exc
        return self
