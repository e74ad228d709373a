"""Who may take part in a weight sync, and how each frame and bucket proves where it came from.

The sender draws a per-run secret (``new_secret``) and puts it in its descriptor, which
reaches the rollout replicas only through the trainer's own channel (the Ray actor calls
that hand the descriptor over), never through a socket or store that a network peer reaches.
On the control connection, both ends prove the secret without sending it:

    receiver -> sender   hello(nonce_r, transport hello)
    sender -> receiver   challenge(nonce_s, HMAC(secret, "sender"   | transcript))
    receiver -> sender   proof(              HMAC(secret, "receiver" | transcript))

where the transcript is both fresh nonces and the digest of the transport hello (so a peer
in the middle cannot swap a Mooncake session address). Either end that sees a wrong proof
drops the connection before any weight byte moves. From then on every control frame is
sealed (``wire.FrameSeal``) with keys derived from the secret and the transcript, one per
direction, and every bucket carries a tag (``BucketMac``) keyed from the secret and the
sender's stream nonce, binding its version, stream and bucket numbers, buffer, length and
chunk layout to its bytes; the tag travels in the (sealed) bucket announcement.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rl_train.engines.weight_sync.errors import IntegrityError, PeerRefusedError, WireFormatError

if TYPE_CHECKING:
    import torch

    from rl_train.engines.weight_sync.wire import Channel, Deadline

SECRET_BYTES = 32
NONCE_BYTES = 32
HELLO_MAX_META_BYTES = 64 << 10
"""Cap on the handshake's frames, read before the peer has proven anything."""
PROTOCOL = b"rl-train weight sync v2"


def new_secret() -> str:
    """A fresh per-run secret, as the hex text the descriptor carries."""
    return secrets.token_hex(SECRET_BYTES)


def secret_from(descriptor: dict[str, Any]) -> bytes:
    """The run's secret from a descriptor; a receiver without one cannot join."""
    text = descriptor.get("secret")
    try:
        secret = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise PeerRefusedError(
            f"the descriptor carries no valid run secret ({2 * SECRET_BYTES} hex digits); "
            "take it from the sender's descriptor()"
        )
    return secret


def derive(key: bytes, label: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``label`` and ``parts``, each length-prefixed so no two inputs collide."""
    data = b"".join(struct.pack("!I", len(part)) + part for part in (PROTOCOL, label, *parts))
    return hmac.digest(key, data, "sha256")


def parse_nonce(text: Any, what: str) -> bytes:
    try:
        nonce = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        nonce = b""
    if len(nonce) != NONCE_BYTES:
        raise WireFormatError(f"{what} must be {2 * NONCE_BYTES} hex digits, got {text!r:.100}")
    return nonce


def _transcript(nonce_r: bytes, nonce_s: bytes, hello: dict[str, Any]) -> bytes:
    canonical = json.dumps(hello, sort_keys=True, separators=(",", ":")).encode()
    return nonce_r + nonce_s + hashlib.sha256(canonical).digest()


def _seal(channel: Channel, secret: bytes, transcript: bytes, sender: bool) -> None:
    to_receiver, to_sender = derive(secret, b"to receiver", transcript), derive(secret, b"to sender", transcript)
    channel.seal(*((to_receiver, to_sender) if sender else (to_sender, to_receiver)))


def sender_handshake(channel: Channel, secret: bytes, deadline: Deadline) -> dict[str, Any]:
    """Check that the peer knows the secret and seal the channel; returns its transport hello.

    Raises ``PeerRefusedError`` (a wrong proof) or another ``TransportError`` (garbage, a
    silent peer): the caller drops this connection only.
    """
    from rl_train.engines.weight_sync.wire import expect

    waiting = "waiting for a connected peer's hello"
    message = channel.recv_message(deadline, waiting, HELLO_MAX_META_BYTES)
    nonce_text, hello = expect(message, "hello", waiting)
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    transcript = _transcript(parse_nonce(nonce_text, "the hello's nonce"), nonce_s, hello)
    proof = derive(secret, b"sender proof", transcript)
    channel.send(("challenge", nonce_s.hex(), proof.hex()), deadline, "sending the challenge")
    waiting = "waiting for the peer's answer to the challenge"
    (answer,) = expect(channel.recv_message(deadline, waiting, HELLO_MAX_META_BYTES), "proof", waiting)
    expected = derive(secret, b"receiver proof", transcript)
    if not hmac.compare_digest(_hex_bytes(answer), expected):
        raise PeerRefusedError("the peer did not prove the run's secret (wrong answer to the challenge)")
    _seal(channel, secret, transcript, sender=True)
    return dict(hello)


def receiver_handshake(
    channel: Channel, secret: bytes, nonce_r: bytes, hello: dict[str, Any], where: str, deadline: Deadline
) -> None:
    """The receiver's half, after it sent ``hello(nonce_r, hello)``: check the sender's proof
    (a peer that does not know the secret gets nothing, not even ours) and answer."""
    from rl_train.engines.weight_sync.wire import expect

    waiting = f"waiting for the sender's welcome (its challenge, from {where})"
    message = channel.recv_message(deadline, waiting, HELLO_MAX_META_BYTES)
    nonce_text, proof = expect(message, "challenge", waiting)
    transcript = _transcript(nonce_r, parse_nonce(nonce_text, "the challenge's nonce"), hello)
    if not hmac.compare_digest(_hex_bytes(proof), derive(secret, b"sender proof", transcript)):
        raise PeerRefusedError(
            f"the peer at {where} did not prove the secret of this receiver's descriptor "
            "(an impostor, or the sender of another run); nothing was sent to it"
        )
    answer = derive(secret, b"receiver proof", transcript)
    channel.send(("proof", answer.hex()), deadline, "answering the sender's challenge")
    _seal(channel, secret, transcript, sender=False)


def _hex_bytes(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def host_bytes(data: torch.Tensor) -> memoryview:
    """The bytes of a uint8 tensor as a buffer on the host (a device bucket is copied down:
    on a GPU the tag costs a device-to-host copy of every bucket, at each end)."""
    return (data if data.device.type == "cpu" else data.cpu()).numpy().data


class BucketMac:
    """The tag of one bucket: Poly1305 under a one-time key derived by HMAC-SHA256.

    The one-time key is HMAC(stream key, version | stream | bucket | buffer | bytes | digest
    of the chunk records), so the header is bound into the key and the bytes into the tag;
    a bucket moved to another place, stream or version fails as surely as a flipped byte.
    Poly1305 runs at several GB/s per core where HMAC-SHA256 runs at about 1.5
    (``bench/weight_sync.py --mac-cost`` measures both); the same key only ever tags the
    same bytes (a resend), which is what keeps a one-time MAC secure.
    """

    checks = True
    """The receiver checks tags (and so copies shared buffers out first); only a bench's
    no-MAC baseline says otherwise."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _one_time_key(self, header: Sequence[int], records: list[Any]) -> bytes:
        layout = hashlib.sha256(json.dumps(records, separators=(",", ":")).encode()).digest()
        return derive(self._key, b"bucket", struct.pack("!5Q", *header), layout)

    def tag(self, header: Sequence[int], records: list[Any], pieces: Sequence[torch.Tensor]) -> str:
        """``header`` is (version, stream, bucket, buffer, bytes); ``pieces`` the bytes in order."""
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        mac = Poly1305(self._one_time_key(header, records))
        for piece in pieces:
            if piece.numel():
                mac.update(host_bytes(piece))
        return mac.finalize().hex()

    def check(self, header: Sequence[int], records: list[Any], data: torch.Tensor, tag: str) -> None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        try:
            Poly1305.verify_tag(self._one_time_key(header, records), host_bytes(data), _hex_bytes(tag))
        except InvalidSignature:
            raise _damaged(header) from None

    def check_into(
        self, header: Sequence[int], records: list[Any], source: torch.Tensor, target: torch.Tensor, tag: str
    ) -> None:
        """Copy ``source`` (a buffer others can write) into ``target`` (this process's) and check
        the copy: piece by piece, each piece fed to the MAC while it is still in the cache."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        mac = Poly1305(self._one_time_key(header, records))
        for start in range(0, source.numel(), COPY_PIECE_BYTES):
            piece = target[start : start + COPY_PIECE_BYTES]
            piece.copy_(source[start : start + COPY_PIECE_BYTES])
            mac.update(host_bytes(piece))
        try:
            mac.verify(_hex_bytes(tag))
        except InvalidSignature:
            raise _damaged(header) from None


COPY_PIECE_BYTES = 1 << 20
"""Pieces of a bucket copied and fed to the MAC in turn: small enough to stay in the cache."""


def _damaged(header: Sequence[int]) -> IntegrityError:
    version, stream, bucket, index, _ = header
    return IntegrityError(
        f"bucket {bucket} of stream {stream} (version {version}, buffer {index}) failed its MAC "
        "check: its bytes were changed after the sender tagged them"
    )
