"""The control channel: small length-prefixed messages over a loopback/LAN TCP socket.

Every streaming transport sends its metadata (bucket layouts, versions, acks) here, ahead
of or beside the bulk bytes. Each blocking call takes a deadline and a sentence saying
what it waits for, so a dead peer turns into a ``TransportError`` that names both the
boundary and the thing that never came, never into a silent hang.
"""

from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any

from rl_train.engines.weight_sync.errors import TransportError

_LENGTH = struct.Struct("!Q")


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


def recv_exact(sock: socket.socket, view: memoryview, deadline: Deadline, waiting_for: str) -> None:
    """Fill ``view`` from ``sock``; a closed peer or the deadline raises naming ``waiting_for``."""
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
            raise TransportError(f"the peer closed the connection {waiting_for}")
        received += count


def send_all(sock: socket.socket, data: bytes | memoryview, deadline: Deadline, waiting_for: str) -> None:
    sock.settimeout(deadline.remaining(waiting_for))
    try:
        sock.sendall(data)
    except TimeoutError as exc:
        raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting_for}") from exc
    except OSError as exc:
        raise TransportError(f"connection lost {waiting_for}: {exc}") from exc


def send_message(sock: socket.socket, message: Any, deadline: Deadline, waiting_for: str) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    send_all(sock, _LENGTH.pack(len(body)) + body, deadline, waiting_for)


def recv_message(sock: socket.socket, deadline: Deadline, waiting_for: str) -> Any:
    header = bytearray(_LENGTH.size)
    recv_exact(sock, memoryview(header), deadline, waiting_for)
    (length,) = _LENGTH.unpack(header)
    body = bytearray(length)
    recv_exact(sock, memoryview(body), deadline, waiting_for)
    return pickle.loads(body)


def expect(message: Any, kind: str, waiting_for: str) -> tuple[Any, ...]:
    """Check that ``message`` is a tuple tagged ``kind``; the protocol is out of step otherwise."""
    if not isinstance(message, tuple) or not message or message[0] != kind:
        tag = message[0] if isinstance(message, tuple) and message else type(message).__name__
        raise TransportError(f"protocol out of step {waiting_for}: expected {kind!r}, got {tag!r}")
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
