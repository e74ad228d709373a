"""``mooncake``: the sender writes each bucket into the receivers' registered buffers.

Uses the Mooncake TransferEngine with peer-to-peer handshakes (no metadata server): every
receiver registers two bucket buffers and tells the sender its session address and the
buffer addresses; the sender registers its own two buffers and writes each bucket with
one ``batch_transfer_sync_write``, big chunks straight from the exported tensors.

``rollout.weight_sync.mooncake`` picks the protocol: ``tcp`` (any host; on CPU hosts
``mooncake-transfer-engine-non-cuda`` plus ``libibverbs1``) or ``rdma`` over named devices
(or every active one). Mooncake decides by itself from its device scan (RDMA whenever it
finds an active device, TCP otherwise) and takes the protocol argument only as a hint, so the
choice is enforced here: ``tcp`` starts the engine with ``MC_FORCE_TCP`` set, and ``rdma``
checks the devices in sysfs first (``rdma_devices``) and starts the engine with
``MC_FORCE_TCP`` unset and only those devices in its filter. The sender's settings travel in
its descriptor, so each receiver starts its engine the same way (``auto`` resolved on its own
node).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from rl_train.engines.node_address import is_loopback, node_ip
from rl_train.engines.weight_sync.errors import TransportError, WireFormatError
from rl_train.engines.weight_sync.transports.rdma_devices import resolve_devices
from rl_train.engines.weight_sync.wire import Channel, Deadline

FORCE_TCP_VARIABLE = "MC_FORCE_TCP"
"""Mooncake installs only its TCP transport while this is set (to anything) at ``initialize``."""
_ENVIRONMENT_LOCK = threading.Lock()
"""Engines started from two threads at once must not see each other's ``MC_FORCE_TCP``."""


def available() -> str:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:
        return f"cannot import mooncake.engine: {exc}"
    return ""


@contextlib.contextmanager
def _forced_tcp(force: bool) -> Iterator[None]:
    """``MC_FORCE_TCP`` set (tcp) or unset (rdma) for the time of one ``initialize``, then restored."""
    with _ENVIRONMENT_LOCK:
        before = os.environ.get(FORCE_TCP_VARIABLE)
        if force:
            os.environ[FORCE_TCP_VARIABLE] = "1"
        else:
            os.environ.pop(FORCE_TCP_VARIABLE, None)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(FORCE_TCP_VARIABLE, None)
            else:
                os.environ[FORCE_TCP_VARIABLE] = before


def start_engine(host: str, protocol: str = "tcp", devices: list[str] | str = "") -> Any:
    """A TransferEngine on ``host`` over exactly ``protocol``: ``tcp``, or ``rdma`` over
    ``devices`` (names, or ``auto``), as ``rollout.weight_sync.mooncake`` holds them."""
    from mooncake.engine import TransferEngine

    names = resolve_devices(devices) if protocol == "rdma" else []
    engine = TransferEngine()
    with _forced_tcp(protocol != "rdma"):
        status = engine.initialize(host, "P2PHANDSHAKE", protocol, ",".join(names))
    if status != 0:
        over = f"rdma on {', '.join(names)}" if names else protocol
        raise TransportError(f"Mooncake TransferEngine failed to initialise on {host} over {over}")
    return engine


def _register(engine: Any, buffers: list[torch.Tensor]) -> None:
    for buffer in buffers:
        if engine.register_memory(buffer.data_ptr(), buffer.numel()) != 0:
            raise TransportError("Mooncake could not register a bucket buffer")


DIRECT_MIN_BYTES = 256 << 10
"""Chunks at least this big are written from the tensor's own memory; smaller ones are packed."""


class Sender:
    """Writes each bucket with one batch of writes from the sender's own bucket buffer; with
    ``direct``, big chunks go straight from the exported tensors (registered for the time of
    the write, no packing copy) and the rest from the buffer, at the same offsets, so
    receivers see the usual bucket."""

    data_before_meta = True

    def __init__(self, bucket_size_bytes: int, host: str, options: dict[str, Any]) -> None:
        self._options = {"protocol": options.get("protocol", "tcp"), "devices": options.get("devices", [])}
        """``rollout.weight_sync.mooncake``'s engine settings; the receivers get them in the descriptor."""
        self.direct_allowed = bool(options.get("direct", False))
        """``rollout.weight_sync.mooncake.direct``: whether exported tensors may be registered
        and written from (any peer reaching the engine could write them meanwhile)."""
        self._engine = start_engine(host, **self._options)
        self.buffers = [torch.zeros(bucket_size_bytes, dtype=torch.uint8) for _ in range(2)]
        _register(self._engine, self.buffers)
        self._peers: list[tuple[str, list[int]]] = []
        self._direct: list[list[tuple[int, int, torch.Tensor]]] = [[], []]
        """Per buffer: (offset in the bucket, bytes, the chunk's uint8 view, kept alive until written)."""
        self._registered: dict[tuple[int, int], int] = {}
        """(address, bytes) -> how many pending chunks lie there (one export may alias a tensor)."""

    def descriptor(self) -> dict[str, Any]:
        return {"mooncake": dict(self._options)}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for hello in hellos:
            session, addresses = hello.get("session"), hello.get("addresses")
            if (
                not isinstance(session, str)
                or not isinstance(addresses, list)
                or len(addresses) != 2
                or not all(type(address) is int and address > 0 for address in addresses)
            ):
                raise WireFormatError(f"a Mooncake hello needs a session and two buffer addresses: {hello!r:.200}")
        self._peers = [(hello["session"], hello["addresses"]) for hello in hellos]
        return [{} for _ in hellos]

    def attach(self, conns: list[Channel], deadline: Deadline, key: bytes) -> None:
        return None

    def place_direct(self, index: int, offset: int, data: torch.Tensor) -> bool:
        """Take a big host chunk to write from where it lies (the ``Direct`` hook of the packer)."""
        if not self.direct_allowed or data.numel() < DIRECT_MIN_BYTES or data.device.type != "cpu":
            return False
        region = (data.data_ptr(), data.numel())
        if region not in self._registered:
            if self._engine.register_memory(*region) != 0:
                return False  # not registrable (e.g. overlaps a registered region): packed instead
            self._registered[region] = 0
        self._registered[region] += 1
        self._direct[index].append((offset, data.numel(), data))
        return True

    def segments(self, index: int, nbytes: int) -> list[tuple[int, int, int]]:
        """(source address, offset in the bucket, bytes) covering ``[0, nbytes)`` of bucket ``index``."""
        staged, cursor, pieces = self.buffers[index].data_ptr(), 0, []
        for offset, length, data in self._direct[index]:
            if offset > cursor:
                pieces.append((staged + cursor, cursor, offset - cursor))
            pieces.append((data.data_ptr(), offset, length))
            cursor = offset + length
        if nbytes > cursor:
            pieces.append((staged + cursor, cursor, nbytes - cursor))
        return pieces

    def pieces(self, index: int, nbytes: int) -> list[torch.Tensor]:
        """The bucket's bytes in order: staged runs of the buffer and the direct chunks."""
        staged, cursor, pieces = self.buffers[index], 0, []
        for offset, length, data in self._direct[index]:
            if offset > cursor:
                pieces.append(staged[cursor:offset])
            pieces.append(data)
            cursor = offset + length
        if nbytes > cursor:
            pieces.append(staged[cursor:nbytes])
        return pieces

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        pieces = self.segments(index, nbytes)
        if not pieces:
            return
        sources, offsets, lengths = (list(column) for column in zip(*pieces, strict=True))
        for rank, (session, addresses) in enumerate(self._peers):
            deadline.remaining(f"writing a bucket to receiver {rank} over Mooncake")
            targets = [addresses[index] + offset for offset in offsets]
            if self._engine.batch_transfer_sync_write(session, sources, targets, lengths) != 0:
                raise TransportError(f"Mooncake write of a bucket to receiver {rank} at {session} failed")

    def release(self, index: int) -> None:
        """Forget bucket ``index``'s direct chunks once written (or abandoned)."""
        for _, length, data in self._direct[index]:
            region = (data.data_ptr(), length)
            self._registered[region] -= 1
            if not self._registered[region]:
                del self._registered[region]
                self._engine.unregister_memory(region[0])
        self._direct[index] = []

    def close(self) -> None:
        for index in range(len(self._direct)):
            self.release(index)
        for buffer in self.buffers:
            self._engine.unregister_memory(buffer.data_ptr())
        self._peers = []


class Receiver:
    """Registers two bucket buffers with its TransferEngine. Mooncake lets any peer that
    reaches the engine's RPC port write registered memory (its handshake checks no identity),
    so the buffers are ``shared_buffers``: the stream copies each bucket out and checks the
    copy against its tag, and a write by anyone but the sender fails that check."""

    shared_buffers = True

    def __init__(self, descriptor: dict[str, Any]) -> None:
        sender = descriptor.get("host", "127.0.0.1")
        host = sender if is_loopback(sender) else node_ip()  # this receiver's own node, as peers reach it
        self._host = host
        self._engine = start_engine(host, **descriptor["mooncake"])
        size = descriptor["bucket_size_bytes"]
        self._buffers = [torch.zeros(size, dtype=torch.uint8) for _ in range(2)]
        _register(self._engine, self._buffers)

    def hello(self) -> dict[str, Any]:
        return {
            "session": f"{self._host}:{self._engine.get_rpc_port()}",
            "addresses": [buffer.data_ptr() for buffer in self._buffers],
        }

    def attach(self, welcome: dict[str, Any], channel: Channel, deadline: Deadline, key: bytes) -> None:
        return None

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        return self._buffers[index][:nbytes]

    def close(self) -> None:
        for buffer in self._buffers:
            self._engine.unregister_memory(buffer.data_ptr())
