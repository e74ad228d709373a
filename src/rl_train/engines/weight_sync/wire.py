"""The control channel: framed messages over a loopback/LAN TCP socket.

Every streaming transport sends its metadata (bucket layouts, versions, acks) here, ahead
of or beside the bulk bytes, as frames of ``frame.py`` (JSON and raw bytes, never pickle).
Each blocking call takes a deadline and a sentence saying what it waits for, so a dead
peer turns into a ``TransportError`` that names both the boundary and the thing that never
came, never into a silent hang; a malformed frame is a ``WireFormatError``.
"""

from __future__ import annotations

import hmac
import socket
import time
from collections.abc import Sequence

import torch

from rl_train.engines.weight_sync import frame
from rl_train.engines.weight_sync.errors import (
    IntegrityError,
    PeerRefusedError,
    TransportError,
    WireFormatError,
)
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


class FrameSeal:
    """One direction of a sealed channel: HMAC-SHA256 over (sequence number, header, metadata).

    The sequence number is counted by both ends and never sent, so a frame that is replayed,
    dropped or reordered fails its check as surely as a forged one does.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._count = 0

    def tag(self, head: bytes) -> bytes:
        """The tag of the next frame, whose header and metadata are ``head``."""
        digest = hmac.digest(self._key, self._count.to_bytes(8, "big") + head, "sha256")
        self._count += 1
        return digest

    def check(self, head: bytes, tag: bytes, waiting_for: str) -> None:
        number = self._count
        if not hmac.compare_digest(self.tag(head), tag):
            raise IntegrityError(
                f"frame {number} {waiting_for} failed its MAC check: forged, replayed, reordered or damaged"
            )


def send_frame(
    sock: socket.socket,
    message: Message,
    tensors: Sequence[torch.Tensor],
    deadline: Deadline,
    waiting_for: str,
    seal: FrameSeal | None = None,
) -> None:
    """Send one frame: ``message`` (JSON-able fields) and the raw bytes of ``tensors``."""
    for piece in frame.encode_frame(message, tensors, seal.tag if seal is not None else None):
        send_all(sock, piece, deadline, waiting_for)


def send_message(
    sock: socket.socket, message: Message, deadline: Deadline, waiting_for: str, seal: FrameSeal | None = None
) -> None:
    send_frame(sock, message, (), deadline, waiting_for, seal)


def recv_frame(
    sock: socket.socket,
    deadline: Deadline,
    waiting_for: str,
    max_payload_bytes: int,
    max_meta_bytes: int = frame.MAX_META_BYTES,
    into: torch.Tensor | None = None,
    seal: FrameSeal | None = None,
) -> tuple[Message, list[torch.Tensor]]:
    """One frame's message and tensors; the tensors view ``into`` when it is big enough.

    Declared lengths are checked against the caps before anything is allocated or read; on a
    sealed channel (``seal``) the tag is checked before the metadata is parsed.
    """
    header = bytearray(frame.HEADER.size)
    got = _fill(sock, memoryview(header), deadline, waiting_for)
    if got == 0:
        raise TransportError(f"the peer closed the connection {waiting_for}")
    _check_complete(got, len(header), "header", waiting_for)
    meta_nbytes, payload_nbytes = frame.decode_header(bytes(header), max_meta_bytes, max_payload_bytes)
    meta = bytearray(meta_nbytes)
    _check_complete(_fill(sock, memoryview(meta), deadline, waiting_for), meta_nbytes, "metadata", waiting_for)
    if seal is not None:
        tag = bytearray(frame.TAG_BYTES)
        _check_complete(_fill(sock, memoryview(tag), deadline, waiting_for), len(tag), "tag", waiting_for)
        seal.check(bytes(header) + bytes(meta), bytes(tag), waiting_for)
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
    sock: socket.socket,
    deadline: Deadline,
    waiting_for: str,
    max_meta_bytes: int = frame.MAX_META_BYTES,
    seal: FrameSeal | None = None,
) -> Message:
    """One message frame; a frame that carries tensors is refused (no payload allowed)."""
    message, _ = recv_frame(
        sock, deadline, waiting_for, max_payload_bytes=0, max_meta_bytes=max_meta_bytes, seal=seal
    )
    return message


class Channel:
    """A control connection: plain frames during the handshake, sealed ones once it is done.

    ``sealed`` installs the session's two keys (``auth.py``); from then on every frame in
    either direction carries a tag, and one that fails it raises ``IntegrityError``.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._out: FrameSeal | None = None
        self._in: FrameSeal | None = None

    def seal(self, send_key: bytes, receive_key: bytes) -> None:
        self._out, self._in = FrameSeal(send_key), FrameSeal(receive_key)

    def send(
        self, message: Message, deadline: Deadline, waiting_for: str, tensors: Sequence[torch.Tensor] = ()
    ) -> None:
        send_frame(self.sock, message, tensors, deadline, waiting_for, self._out)

    def recv(
        self,
        deadline: Deadline,
        waiting_for: str,
        max_payload_bytes: int = 0,
        max_meta_bytes: int = frame.MAX_META_BYTES,
        into: torch.Tensor | None = None,
    ) -> tuple[Message, list[torch.Tensor]]:
        return recv_frame(self.sock, deadline, waiting_for, max_payload_bytes, max_meta_bytes, into, self._in)

    def recv_message(
        self, deadline: Deadline, waiting_for: str, max_meta_bytes: int = frame.MAX_META_BYTES
    ) -> Message:
        return self.recv(deadline, waiting_for, 0, max_meta_bytes)[0]

    def close(self) -> None:
        self.sock.close()


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
