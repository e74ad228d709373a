"""``tcp``: bucket bytes follow their announcement on each receiver's control socket.

Works across hosts with nothing installed; one ``sendall`` per receiver per bucket, so the
sender's uplink is shared by the receivers.
"""

from __future__ import annotations

import socket
from typing import Any

import torch

from rl_train.engines.weight_sync.wire import Deadline, recv_exact, send_all


def available() -> str:
    return ""


class Sender:
    data_before_meta = False

    def __init__(self, bucket_size_bytes: int, host: str) -> None:
        self.buffers = [torch.empty(bucket_size_bytes, dtype=torch.uint8) for _ in range(2)]
        self._conns: list[socket.socket] = []

    def descriptor(self) -> dict[str, Any]:
        return {}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{} for _ in hellos]

    def attach(self, conns: list[socket.socket], deadline: Deadline) -> None:
        self._conns = conns

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        view = memoryview(self.buffers[index].numpy())[:nbytes]
        for rank, conn in enumerate(self._conns):
            send_all(conn, view, deadline, f"sending a bucket to receiver {rank}")

    def close(self) -> None:
        self._conns = []


class Receiver:
    def __init__(self, descriptor: dict[str, Any]) -> None:
        self._buffer: torch.Tensor | None = None
        self._sock: socket.socket | None = None

    def hello(self) -> dict[str, Any]:
        return {}

    def attach(self, welcome: dict[str, Any], sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        assert self._sock is not None
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)
        view = self._buffer[:nbytes]
        recv_exact(self._sock, memoryview(view.numpy()), deadline, "waiting for bucket bytes from the sender")
        return view

    def close(self) -> None:
        self._sock = None
        self._buffer = None
