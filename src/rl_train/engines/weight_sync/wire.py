"""The control channel: framed messages over a loopback/LAN TCP socket.

Every streaming transport sends its metadata (bucket layouts, versions, acks) here, ahead
of or beside the bulk bytes, as frames of ``frame.py`` (JSON and raw bytes, never pickle).
Each blocking call takes a deadline and a sentence saying what it waits for, so a dead
peer turns into a ``TransportError`` that names both the boundary and the thing that never
came, never into a silent hang; a malformed frame is a ``WireFormatError``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

import torch

from rl_train.engines.weight_sync import frame
from rl_train.engines.weight_sync.errors import PeerRefusedError, TransportError, WireFormatError
from rl_train.engines.weight_sync.frame import Message


class Deadline:
    """A point in time that several waits share, so that their sum stays under the timeout."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self._end = time.monotonic() + timeout_seconds

    def remaining(self, waiting_for: str) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TransportError(f"timed out after {self.timeout_seconds:.1f} s {waiting_for}")
        return left


def _fill(sock: socket.socket, view: memoryview, deadline: Deadline, waiting_for: str) -> int:
    """Read into ``view`` until it is full or the peer closes; returns the bytes read."""
    received = 0
    while received < len(view):
        sock.settimeout(deadline.remaining(waiting_for))
        try:
            count = sock.recv_into(view[received:])
        except TimeoutError:
            deadline.remaining(waiting_for)
            continue
        except OSError as exc:
            raise TransportError(f"connection lost {waiting_for}: {exc}") from exc
        if count == 0:
            break
        received += count
    return received


def recv_exact(sock: socket.socket, view: memoryview, deadline: Deadline, waiting_for: str) -> None:
    """Fill ``view`` from ``sock``; a closed peer or the deadline raises naming ``waiting_for``."""
    if _fill(sock, view, deadline, waiting_for) < len(view):
        raise TransportError(f"the peer closed the connection {waiting_for}")


def send_all(sock: socket.socket, data: bytes | memoryview, deadline: Deadline, waiting_for: str) -> None:
    sock.settimeout(deadline.remaining(waiting_for))
    try:
        sock.sendall(data)
    except TimeoutError as exc:
        raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting_for}") from exc
    except OSError as exc:
        raise TransportError(f"connection lost {waiting_for}: {exc}") from exc


def send_frame(
    sock: socket.socket,
    message: Message,
    tensors: Sequence[torch.Tensor],
    deadline: Deadline,
    waiting_for: str,
) -> None:
    """Send one frame: ``message`` (JSON-able fields) and the raw bytes of ``tensors``."""
    for piece in frame.encode_frame(message, tensors):
        send_all(sock, piece, deadline, waiting_for)


def send_message(sock: socket.socket, message: Message, deadline: Deadline, waiting_for: str) -> None:
    send_frame(sock, message, (), deadline, waiting_for)


def recv_frame(
    sock: socket.socket,
    deadline: Deadline,
    waiting_for: str,
    max_payload_bytes: int,
    max_meta_bytes: int = frame.MAX_META_BYTES,
    into: torch.Tensor | None = None,
) -> tuple[Message, list[torch.Tensor]]:
    """One frame's message and tensors; the tensors view ``into`` when it is big enough.

    Declared lengths are checked against the caps before anything is allocated or read.
    """
    header = bytearray(frame.HEADER.size)
    got = _fill(sock, memoryview(header), deadline, waiting_for)
    if got == 0:
        raise TransportError(f"the peer closed the connection {waiting_for}")
    _check_complete(got, len(header), "header", waiting_for)
    meta_nbytes, payload_nbytes = frame.decode_header(bytes(header), max_meta_bytes, max_payload_bytes)
    meta = bytearray(meta_nbytes)
    _check_complete(_fill(sock, memoryview(meta), deadline, waiting_for), meta_nbytes, "metadata", waiting_for)
    message, specs = frame.decode_meta(meta)
    if into is None or into.numel() < payload_nbytes:
        into = torch.empty(payload_nbytes, dtype=torch.uint8)
    payload = into[:payload_nbytes]
    got = _fill(sock, payload.numpy().data, deadline, waiting_for) if payload_nbytes else 0
    _check_complete(got, payload_nbytes, "payload", waiting_for)
    return message, frame.tensors_from_payload(payload, specs)


def _check_complete(got: int, expected: int, part: str, waiting_for: str) -> None:
    if got < expected:
        raise WireFormatError(
            f"truncated frame {waiting_for}: the peer closed the connection after {got} of {expected} {part} bytes"
        )


def recv_message(
    sock: socket.socket, deadline: Deadline, waiting_for: str, max_meta_bytes: int = frame.MAX_META_BYTES
) -> Message:
    """One message frame; a frame that carries tensors is refused (no payload allowed)."""
    message, _ = recv_frame(sock, deadline, waiting_for, max_payload_bytes=0, max_meta_bytes=max_meta_bytes)
    return message


def expect(message: Message, kind: str, waiting_for: str) -> Message:
    """The fields of ``message``, once it is tagged ``kind``; the protocol is out of step otherwise.

    A ``refused`` message in its place means the sender would not serve this peer.
    """
    if message[0] == "refused" and kind != "refused":
        raise PeerRefusedError(f"the sender refused this receiver {waiting_for}: {message[1]}")
    if message[0] != kind:
        raise TransportError(f"protocol out of step {waiting_for}: expected {kind!r}, got {message[0]!r}")
    return message[1:]


def listen(host: str = "127.0.0.1") -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(64)
    return server


def accept(server: socket.socket, deadline: Deadline, waiting_for: str) -> socket.socket:
    server.settimeout(deadline.remaining(waiting_for))
    try:
        conn, _ = server.accept()
    except TimeoutError as exc:
        raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting_for}") from exc
    tune(conn)
    return conn


def connect(host: str, port: int, deadline: Deadline, waiting_for: str) -> socket.socket:
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=deadline.remaining(waiting_for))
        except ConnectionRefusedError:
            time.sleep(0.05)
            continue
        except OSError as exc:
            raise TransportError(f"cannot connect {waiting_for}: {exc}") from exc
        tune(sock)
        return sock


def tune(sock: socket.socket) -> None:
    """Small control messages must not wait for Nagle; bulk sends want large kernel buffers."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
