"""``tcp``: bucket bytes follow their announcement on each receiver's control socket.

Works across hosts with nothing installed; one frame per receiver per bucket (``frame.py``:
a header, then the raw bytes, at most a bucket long), so the sender's uplink is shared by
the receivers.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_train.engines.weight_sync.errors import WireFormatError
from rl_train.engines.weight_sync.wire import Channel, Deadline, expect


def available() -> str:
    return ""


class Sender:
    data_before_meta = False

    def __init__(self, bucket_size_bytes: int, host: str, options: dict[str, Any]) -> None:
        self.buffers = [torch.empty(bucket_size_bytes, dtype=torch.uint8) for _ in range(2)]
        self._conns: list[Channel] = []

    def descriptor(self) -> dict[str, Any]:
        return {}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{} for _ in hellos]

    def attach(self, conns: list[Channel], deadline: Deadline, key: bytes) -> None:
        self._conns = conns

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        bucket = self.buffers[index][:nbytes]
        for rank, conn in enumerate(self._conns):
            conn.send(("bytes", index), deadline, f"sending a bucket to receiver {rank}", [bucket])

    def close(self) -> None:
        self._conns = []


class Receiver:
    shared_buffers = False

    def __init__(self, descriptor: dict[str, Any]) -> None:
        self._bucket_size_bytes = int(descriptor["bucket_size_bytes"])
        self._buffer = torch.empty(self._bucket_size_bytes, dtype=torch.uint8)
        self._channel: Channel | None = None

    def hello(self) -> dict[str, Any]:
        return {}

    def attach(self, welcome: dict[str, Any], channel: Channel, deadline: Deadline, key: bytes) -> None:
        self._channel = channel

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        assert self._channel is not None, "attach() comes before the first bucket"
        waiting = "waiting for bucket bytes from the sender"
        message, tensors = self._channel.recv(
            deadline, waiting, max_payload_bytes=self._bucket_size_bytes, into=self._buffer
        )
        (got_index,) = expect(message, "bytes", waiting)
        if got_index != index or len(tensors) != 1 or tensors[0].dtype != torch.uint8:
            raise WireFormatError(
                f"expected the bytes of bucket buffer {index}, got {message!r} with {len(tensors)} tensor(s)"
            )
        if tensors[0].numel() != nbytes:
            raise WireFormatError(
                f"bucket buffer {index} was announced with {nbytes} bytes, {tensors[0].numel()} came"
            )
        return tensors[0]

    def close(self) -> None:
        self._channel = None
