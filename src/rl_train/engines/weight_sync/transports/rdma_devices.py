"""Which RDMA devices this node can use, read from sysfs before Mooncake starts.

Mooncake's device scan drops, without an error, every named device that does not exist, has
no active port, has no GID entry or whose verbs node under /dev/infiniband cannot be opened,
and then falls back to TCP when none is left. Reading the same facts here first lets an
``rdma`` transport refuse to start, naming the device and what is wrong with it, instead of
running a job over TCP that was configured for RDMA.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rl_train.engines.weight_sync.errors import TransportError

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
"""One folder per RDMA device the kernel knows (InfiniBand and RoCE alike)."""
DEV_INFINIBAND = Path("/dev/infiniband")
"""The verbs character devices (``uverbsN``) user space opens to drive them."""
PORT_ACTIVE = "4"
"""``ports/N/state`` reads ``4: ACTIVE`` for a port that can carry traffic."""
DEVICES_FIELD = "rollout.weight_sync.mooncake.devices"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    problem: str
    """Empty when usable; otherwise why Mooncake would skip it."""


def inspect_device(name: str) -> RdmaDevice:
    """The device's state as Mooncake's scan judges it: a verbs node that opens read-write, and
    a port that is active and has GID entries."""
    folder = SYSFS_INFINIBAND / name
    if not folder.is_dir():
        return RdmaDevice(name, f"no {folder}")
    verbs = sorted(path.name for path in (folder / "device" / "infiniband_verbs").glob("uverbs*"))
    if not verbs:
        return RdmaDevice(name, f"no verbs device under {folder / 'device' / 'infiniband_verbs'}")
    node = DEV_INFINIBAND / verbs[0]
    try:
        is_char = stat.S_ISCHR(node.stat().st_mode)
    except OSError:
        is_char = False
    if not is_char or not os.access(node, os.R_OK | os.W_OK):
        return RdmaDevice(name, f"{node} is not a character device this process can open read-write")
    ports = sorted((folder / "ports").glob("*"), key=lambda port: port.name)
    if not any(_port_usable(port) for port in ports):
        states = ", ".join(f"port {port.name}: {_read(port / 'state') or '?'}" for port in ports) or "no ports"
        return RdmaDevice(name, f"no active port with GID entries ({states})")
    return RdmaDevice(name, "")


def _port_usable(port: Path) -> bool:
    gids = port / "gids"
    return _read(port / "state").split(":")[0].strip() == PORT_ACTIVE and gids.is_dir() and any(gids.iterdir())


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def list_devices() -> list[RdmaDevice]:
    """Every RDMA device the kernel lists, usable or not, by name."""
    if not SYSFS_INFINIBAND.is_dir():
        return []
    return [inspect_device(path.name) for path in sorted(SYSFS_INFINIBAND.iterdir())]


def resolve_devices(devices: list[str] | str) -> list[str]:
    """The device names to hand Mooncake on this node: ``devices`` if every one is usable,
    every usable one for ``auto``; ``TransportError`` naming the field and what is there otherwise."""
    found = list_devices()
    usable = [device.name for device in found if not device.problem]
    here = f"usable on this node: {', '.join(usable) or 'none'}"
    if devices == "auto":
        if not usable:
            seen = "; ".join(f"{device.name}: {device.problem}" for device in found) or f"{SYSFS_INFINIBAND} lists no device"
            raise TransportError(f"{DEVICES_FIELD}: 'auto' found no usable RDMA device on this node ({seen})")
        return usable
    problems = [inspect_device(name) for name in devices]
    bad = [f"{device.name}: {device.problem}" for device in problems if device.problem]
    if bad:
        raise TransportError(f"{DEVICES_FIELD}: {list(devices)!r} cannot all be used ({'; '.join(bad)}); {here}")
    return list(devices)


def describe_devices() -> str:
    """One line for logs and reports: each device and ``usable`` or why not."""
    found = list_devices()
    return "; ".join(f"{device.name}: {device.problem or 'usable'}" for device in found) or f"{SYSFS_INFINIBAND} lists none"
