"""``mooncake``: the sender writes each bucket into the receivers' registered buffers.

Uses the Mooncake TransferEngine with peer-to-peer handshakes (no metadata server): every
receiver registers two bucket buffers and tells the sender its session address and the
buffer addresses; the sender registers its own two buffers and writes with
``transfer_sync_write``. Over TCP on CPU hosts (``mooncake-transfer-engine-non-cuda`` plus
``libibverbs1``), over RDMA with the CUDA wheel on GPU clusters.
"""

from __future__ import annotations

import socket
from typing import Any

import torch

from rl_train.engines.weight_sync.boundaries import TransportError
from rl_train.engines.weight_sync.wire import Deadline

PROTOCOL = "tcp"


def available() -> str:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:
        return f"cannot import mooncake.engine: {exc}"
    return ""


def _start_engine(host: str) -> Any:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize(host, "P2PHANDSHAKE", PROTOCOL, "") != 0:
        raise TransportError(f"Mooncake TransferEngine failed to initialise on {host} over {PROTOCOL}")
    return engine


def _register(engine: Any, buffers: list[torch.Tensor]) -> None:
    for buffer in buffers:
        if engine.register_memory(buffer.data_ptr(), buffer.numel()) != 0:
            raise TransportError("Mooncake could not register a bucket buffer")


class Sender:
    data_before_meta = True

    def __init__(self, bucket_size_bytes: int, host: str) -> None:
        self._engine = _start_engine(host)
        self.buffers = [torch.zeros(bucket_size_bytes, dtype=torch.uint8) for _ in range(2)]
        _register(self._engine, self.buffers)
        self._peers: list[tuple[str, list[int]]] = []

    def descriptor(self) -> dict[str, Any]:
        return {}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._peers = [(hello["session"], hello["addresses"]) for hello in hellos]
        return [{} for _ in hellos]

    def attach(self, conns: list[socket.socket], deadline: Deadline) -> None:
        return None

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        source = self.buffers[index].data_ptr()
        for rank, (session, addresses) in enumerate(self._peers):
            deadline.remaining(f"writing a bucket to receiver {rank} over Mooncake")
            if self._engine.transfer_sync_write(session, source, addresses[index], nbytes) != 0:
                raise TransportError(f"Mooncake write of a bucket to receiver {rank} at {session} failed")

    def close(self) -> None:
        for buffer in self.buffers:
            self._engine.unregister_memory(buffer.data_ptr())
        self._peers = []


class Receiver:
    def __init__(self, descriptor: dict[str, Any]) -> None:
        host = descriptor.get("host", "127.0.0.1")
        self._host = host
        self._engine = _start_engine(host)
        size = descriptor["bucket_size_bytes"]
        self._buffers = [torch.zeros(size, dtype=torch.uint8) for _ in range(2)]
        _register(self._engine, self._buffers)

    def hello(self) -> dict[str, Any]:
        return {
            "session": f"{self._host}:{self._engine.get_rpc_port()}",
            "addresses": [buffer.data_ptr() for buffer in self._buffers],
        }

    def attach(self, welcome: dict[str, Any], sock: socket.socket, deadline: Deadline) -> None:
        return None

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        return self._buffers[index][:nbytes]

    def close(self) -> None:
        for buffer in self._buffers:
            self._engine.unregister_memory(buffer.data_ptr())
