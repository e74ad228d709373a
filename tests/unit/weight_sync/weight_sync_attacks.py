"""Attackers for the weight-sync security tests, kept out of the production transports.

Each one is what a peer on the network (or a process beside the receiver) could do: flip a
byte of a bucket in flight, write into a receiver's buffer, pose as the sender.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import torch

from rl_train.engines.weight_sync import wire
from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.base import AbortableTensors
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.transports import tcp
from rl_train.engines.weight_sync.wire import Channel, Deadline


class FlippingTcpSender(tcp.Sender):
    """Sends the first ``times`` buckets with one byte flipped (on a copy), as a peer in the
    middle of the link would; the tag was taken over the true bytes."""

    times = 1

    def __init__(self, bucket_size_bytes: int, host: str, options: dict[str, Any]) -> None:
        super().__init__(bucket_size_bytes, host, options)
        self.flipped = 0

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        if self.flipped >= self.times or nbytes == 0:
            super().push(index, nbytes, deadline)
            return
        self.flipped += 1
        damaged = self.buffers[index][:nbytes].clone()
        damaged[nbytes // 2] ^= 0x01
        for rank, conn in enumerate(self._conns):
            conn.send(("bytes", index), deadline, f"sending a bucket to receiver {rank}", [damaged])


class InProcessPair:
    """Sender here, receiver in a thread of this process (so a test can swap a transport class
    on either end, or patch what goes over the wire)."""

    def __init__(self, cfg: WeightSyncConfig) -> None:
        self.cfg = cfg
        backend = build_weight_sync_backend(cfg)
        self.sender = backend.build_sender()
        self.receiver = backend.build_receiver(self.sender.descriptor())

    def sync(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, Any]:
        """The receiver's weights and error, and the sender's error, of one sync."""
        result: dict[str, Any] = {"weights": {}, "error": None, "sender_error": None}

        def receive() -> None:
            tensors: Any = None
            try:
                tensors, _ = self.receiver.receive(None, self.cfg.timeout_seconds)
                result["weights"] = {name: tensor.clone() for name, tensor in tensors}
            except Exception as exc:  # handed to the test; the sender hears of it, as run_receiver does
                result["error"] = exc
                if isinstance(tensors, AbortableTensors):
                    tensors.close()

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        try:
            self.sender.send(iter(weights.items()), version)
        except Exception as exc:
            result["sender_error"] = exc
        finally:
            thread.join(self.cfg.timeout_seconds + 10)
        return result

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def sync_in_process(cfg: WeightSyncConfig, weights: dict[str, torch.Tensor], versions: int = 1) -> dict[str, Any]:
    """``versions`` syncs of ``weights`` over a fresh pair; the last one's result, and both ends."""
    pair = InProcessPair(cfg)
    try:
        for version in range(1, versions + 1):
            result = pair.sync(weights, version)
            if result["error"] or result["sender_error"]:
                break
    finally:
        pair.close()
    return result | {"sender": pair.sender, "receiver": pair.receiver}


class RogueSender:
    """A listener that speaks the protocol but does not know the run's secret: it answers a
    hello with a made-up challenge and records every byte the receiver sends it."""

    def __init__(self) -> None:
        self.server = wire.listen("127.0.0.1")
        self.port = self.server.getsockname()[1]
        self.received = bytearray()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn = Channel(wire.accept(self.server, Deadline(30.0), "in the rogue sender"))
        try:
            self.received += _frame_bytes(conn)  # the hello
            conn.send(("challenge", "ab" * 32, "cd" * 32), Deadline(5.0), "in the rogue sender")
            conn.sock.settimeout(3.0)
            for chunk in iter(lambda: conn.sock.recv(1 << 16), b""):
                self.received += chunk  # whatever else the receiver says (it should say nothing)
        except OSError:
            pass
        finally:
            conn.close()

    def join(self) -> None:
        self._thread.join(10.0)
        self.server.close()


def _frame_bytes(conn: Channel) -> bytes:
    """One plain frame, as the raw bytes that came in (the rogue keeps a recording)."""
    recording = _Recorder(conn.sock)
    wire.recv_message(recording, Deadline(10.0), "in the rogue sender")  # type: ignore[arg-type]
    return bytes(recording.data)


class _Recorder:
    """A socket stand-in that keeps a copy of what is read through it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.data = bytearray()

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def recv_into(self, view: memoryview) -> int:
        count = self._sock.recv_into(view)
        self.data += bytes(view[:count])
        return count


def listening_addresses(port: int) -> Iterator[str]:
    """The local addresses of TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:
                    yield address
