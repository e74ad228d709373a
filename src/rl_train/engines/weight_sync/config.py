"""``rollout.weight_sync.*``: which backend moves weights, over which transport, and its knobs.

Availability is checked here, at config load: a transport whose package is missing fails
with its install hint before any worker starts, never in the middle of a run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.weight_sync.backends import WEIGHT_SYNC_BACKENDS
from rl_train.engines.weight_sync.transports import TransportName, check_transport_available

RDMA_DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""What an RDMA device name looks like (``mlx5_0``, ``rocep1s0f0``): Mooncake takes the names
joined by commas and they are looked up under /sys/class/infiniband, so no comma, no slash."""


class MooncakeConfig(StrictModel):
    """``rollout.weight_sync.mooncake``: how the Mooncake transport moves bytes.

    Mooncake itself picks RDMA whenever its device scan finds an active RDMA device and TCP
    otherwise, whatever protocol it is handed; the transport makes this choice explicit: `tcp`
    is forced to TCP, and `rdma` checks its devices on each node before the engine starts and
    fails naming them rather than falling back to TCP.
    """

    protocol: Literal["tcp", "rdma"] = "tcp"
    """`tcp` (any host), or `rdma` over the RDMA devices named in `devices`."""
    direct: bool = False
    """Write chunks of 256 KiB and more straight from the exported tensors (registered with
    Mooncake for the time of the write) instead of packing them into the sender's buffer,
    saving that copy. Off by default: Mooncake lets any peer that reaches an engine's ports
    write its registered memory, and the torch engine exports its live parameters, so for the
    time of a write such a peer could change the trainer's own weights. Turn it on only where
    every host that can reach the nodes is trusted."""
    devices: list[str] | Literal["auto"] = Field(default_factory=list, validate_default=True)
    """`rdma`: the RDMA devices each node uses, e.g. [mlx5_0, mlx5_1] (the same names on every
    node), or `auto`: every active device under /sys/class/infiniband of each node. `tcp`: none."""

    @field_validator("devices", mode="before")
    @classmethod
    def _split_names(cls, devices: object) -> object:
        """``mlx5_0,mlx5_1`` (an override, or Mooncake's own spelling) is the list of both."""
        if isinstance(devices, str) and devices != "auto":
            return [name.strip() for name in devices.split(",") if name.strip()]
        return devices

    @field_validator("devices")
    @classmethod
    def _check_devices(cls, devices: list[str] | str, info: ValidationInfo) -> list[str] | str:
        """Messages name no field: pydantic puts this field's path (``…mooncake.devices``) before them."""
        protocol = info.data.get("protocol")
        if protocol == "tcp" and devices:
            raise ValueError(
                f"got {devices!r}, but protocol 'tcp' uses no RDMA device; set [] or protocol: rdma"
            )
        if protocol == "rdma" and not devices:
            raise ValueError(
                "got [], but protocol 'rdma' needs the RDMA devices to use: their names "
                "(e.g. [mlx5_0, mlx5_1], as listed under /sys/class/infiniband) or 'auto' (every active one)"
            )
        if isinstance(devices, list):
            bad = [name for name in devices if not RDMA_DEVICE_NAME.fullmatch(name)]
            if bad:
                raise ValueError(f"{bad!r} are not RDMA device names (letters, digits, '_', '.', '-')")
            if len(set(devices)) != len(devices):
                raise ValueError(f"{devices!r} names a device twice")
        return devices


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
    mooncake: MooncakeConfig = Field(default_factory=MooncakeConfig)
    """`mooncake` transport: TCP or RDMA, and over which RDMA devices."""

    def transport_options(self) -> dict[str, Any]:
        """The chosen transport's own section as plain data (the transports sit below this
        config and never import it): ``mooncake`` for Mooncake, ``{}`` for the others."""
        sections: dict[str, StrictModel] = {"mooncake": self.mooncake}
        section = sections.get(self.transport)
        return section.model_dump() if section is not None else {}

    @model_validator(mode="after")
    def _check_available(self) -> WeightSyncConfig:
        uses_transport = WEIGHT_SYNC_BACKENDS.get(self.backend).uses_transport
        if self.mooncake.protocol == "rdma" and not (uses_transport and self.transport == "mooncake"):
            raise ValueError(
                f"rollout.weight_sync.mooncake.protocol: 'rdma' is set, but backend {self.backend!r} over transport "
                f"{self.transport!r} does not use Mooncake (set transport: mooncake with backend bucketed or delta)"
            )
        if uses_transport:
            try:
                check_transport_available(self.transport)
            except ValueError as exc:
                raise ValueError(f"rollout.weight_sync.transport: {exc}") from exc
        return self
