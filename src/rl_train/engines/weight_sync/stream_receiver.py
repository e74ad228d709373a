"""The receiving end of a bucketed stream (protocol in ``stream.py``).

Tensors come out as the engine asks for them; whole tensors are views of the bucket
buffer, lent until the next one is requested. Each bucket's bytes are checked against the
tag its announcement carries before any tensor is handed out; where other processes can
write the transport's buffer (shared memory, Mooncake's registered buffers), the bytes are
first copied into memory of this process, so nothing can change them between the check and
the engine's copy.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
from collections.abc import Generator
from typing import Any

import torch

from rl_train.engines.weight_sync import auth, stream, wire
from rl_train.engines.weight_sync.buckets import ChunkMeta, TensorAssembler
from rl_train.engines.weight_sync.errors import IntegrityError, TransportError, WireFormatError
from rl_train.engines.weight_sync.frame import Message
from rl_train.engines.weight_sync.transports import get_transport
from rl_train.engines.weight_sync.wire import Channel, Deadline

logger = logging.getLogger(__name__)

Announced = tuple[int, int, list[ChunkMeta], list[Any], str]
"""A bucket announcement: (buffer index, bytes, chunks, their records as sent, the bytes' tag)."""


class StreamReceiver:
    """Connects at construction (so the sender can count it) and finishes the handshake in a
    thread, which answers the sender's challenge whenever the sender gets to this connection.

    A sender that does not prove the run's secret is dropped (``PeerRefusedError`` from
    ``begin``) before it has learnt anything; a sender that refuses this receiver answers
    ``refused``, raised the same way.
    """

    def __init__(self, descriptor: dict[str, Any], connect_timeout_seconds: float) -> None:
        self._descriptor = descriptor
        self._bucket_size_bytes = int(descriptor["bucket_size_bytes"])
        self._transport = get_transport(descriptor["transport"]).Receiver(descriptor)
        self._secret = auth.secret_from(descriptor)
        deadline = Deadline(connect_timeout_seconds)
        self._where = f"{descriptor['host']}:{descriptor['port']}"
        self._channel = Channel(
            wire.connect(descriptor["host"], descriptor["port"], deadline, f"to the sender at {self._where}")
        )
        nonce, hello = secrets.token_bytes(auth.NONCE_BYTES), self._transport.hello()
        self._channel.send(("hello", nonce.hex(), hello), deadline, "saying hello to the sender")
        self._handshake_error: BaseException | None = None
        self._closing = False
        self._handshake = threading.Thread(
            target=self._answer, args=(nonce, hello), name="weight-sync-handshake", daemon=True
        )
        self._handshake.start()
        self._attached = False
        self._sender_aborted = False
        self._in_stream = False
        self._unacked: int | None = None
        self._num_streams = 0
        self._mac: auth.BucketMac | None = None
        self._private: torch.Tensor | None = None
        """This process's copy of a bucket, for transports whose buffers others can write."""
        self._stashed: tuple[Announced, torch.Tensor] | None = None
        """The next bucket, read while waiting for a resend of the one before."""
        self.num_rejected = 0
        """Buckets that failed their MAC check here (each then asked for again)."""

    def _answer(self, nonce: bytes, hello: dict[str, Any]) -> None:
        """The handshake, in its thread; it waits as long as the sender takes to reach this
        connection (closing the receiver ends it)."""
        try:
            auth.receiver_handshake(self._channel, self._secret, nonce, hello, self._where, Deadline(7 * 86400.0))
        except BaseException as exc:  # handed to begin(), which raises it
            if not self._closing:
                logger.warning("weight sync: dropped the connection to %s: %s", self._where, exc)
            self._handshake_error = exc
            with contextlib.suppress(OSError):  # the peer hears the end at once, learns nothing
                self._channel.sock.shutdown(socket.SHUT_RDWR)

    def send(self, message: Message, deadline: Deadline, waiting_for: str) -> None:
        self._channel.send(message, deadline, waiting_for)

    def recv(self, kind: str, deadline: Deadline, waiting_for: str) -> Message:
        return wire.expect(self.recv_any(deadline, waiting_for), kind, waiting_for)

    def recv_any(self, deadline: Deadline, waiting_for: str) -> Message:
        return self._channel.recv_message(deadline, waiting_for)

    def begin(self, deadline: Deadline) -> dict[str, Any]:
        """Wait for the next stream's header (the handshake and welcome first, on the first sync)."""
        if not self._attached:
            self._attach(deadline)
        (header,) = self.recv("begin", deadline, "waiting for the sender to begin a sync")
        if type(header.get("version")) is not int or not isinstance(header.get("kind"), str):
            raise WireFormatError(f"stream header {header!r:.200} needs an integer version and a kind")
        self._sender_aborted, self._in_stream = False, True
        self._version, self._stream = header["version"], self._num_streams
        self._num_streams += 1
        return header

    def _attach(self, deadline: Deadline) -> None:
        waiting = "waiting for the sender's welcome (the sender has not started its first sync)"
        self._handshake.join(deadline.remaining(waiting))
        if self._handshake.is_alive():
            raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting}")
        if self._handshake_error is not None:
            raise self._handshake_error
        (welcome,) = self.recv("welcome", deadline, "waiting for the sender's welcome")
        nonce = welcome.get("stream_nonce")
        if not isinstance(welcome.get("transport"), dict):
            raise WireFormatError(f"the welcome needs a stream nonce and the transport's part: {welcome!r:.200}")
        nonce_bytes = auth.parse_nonce(nonce, "the welcome's stream nonce")
        self._mac = auth.BucketMac(auth.derive(self._secret, b"buckets", nonce_bytes))
        key = auth.derive(self._secret, b"transport", nonce_bytes)
        self._transport.attach(welcome["transport"], self._channel, deadline, key)
        self._attached = True

    def tensors(self, deadline: Deadline) -> Generator[tuple[str, torch.Tensor], None, None]:
        """The stream's tensors, acked bucket by bucket.

        Each tensor is valid until the next one is requested (whole tensors are views of the
        bucket buffer, which the sender refills after the ack): consume, or copy, as you go.
        """
        assembler = TensorAssembler()
        number = 0
        while True:
            received = self._next_bucket(deadline, number)
            if received is None:
                assembler.finish()
                return
            bucket = self._checked(received, number, deadline)
            index, _, chunks, _, _ = received[0]
            self._unacked = index
            yield from assembler.add_bucket(bucket, chunks)  # views: consumed before the ack
            self._ack(deadline, number)
            number += 1

    def _next_bucket(self, deadline: Deadline, number: int) -> tuple[Announced, torch.Tensor] | None:
        """The next bucket's announcement and bytes as the transport delivered them (unchecked),
        or ``None`` at the end of the stream."""
        if self._stashed is not None:
            stashed, self._stashed = self._stashed, None
            return stashed
        announced = self._announcement(self.recv_any(deadline, f"waiting for bucket {number} from the sender"), number)
        if announced is None:
            return None
        return announced, self._transport.pull(announced[0], announced[1], deadline)

    def _announcement(self, message: Message, number: int) -> Announced | None:
        if message[0] == "abort":
            self._sender_aborted, self._in_stream = True, False
            raise TransportError(f"the sender aborted the sync at bucket {number}: {message[1]}")
        if message[0] == "end":
            self._in_stream = False
            if message[1] != number:
                raise TransportError(f"the sender sent {message[1]} buckets, {number} arrived")
            return None
        index, nbytes, records, tag = wire.expect(message, "bucket", f"waiting for bucket {number}")
        if index not in (0, 1) or not 0 <= nbytes <= self._bucket_size_bytes:
            raise WireFormatError(
                f"bucket {number} announces buffer {index} with {nbytes} bytes; "
                f"there are buffers 0 and 1 of {self._bucket_size_bytes} bytes"
            )
        return index, nbytes, [ChunkMeta.from_wire(record, nbytes) for record in records], records, tag

    def _checked(self, received: tuple[Announced, torch.Tensor], number: int, deadline: Deadline) -> torch.Tensor:
        """The bucket's bytes once they match their tag; a damaged bucket is asked for again."""
        (index, nbytes, _, records, tag), data = received
        assert self._mac is not None, "the welcome comes before the first bucket"
        copy_out = self._mac.checks and getattr(self._transport, "shared_buffers", False)
        header = (self._version, self._stream, number, index, nbytes)
        for attempt in range(stream.MAX_RESENDS + 1):
            try:
                if copy_out and attempt == 0:  # a resend already lies in this process's memory
                    target = self._private_buffer()[:nbytes]
                    self._mac.check_into(header, records, data, target, tag)
                    return target
                self._mac.check(header, records, data, tag)
                return data
            except IntegrityError as exc:
                self.num_rejected += 1
                if attempt == stream.MAX_RESENDS:
                    error = IntegrityError(f"{exc.reason}; still damaged after {attempt} resends")
                    self._give_up(error.reason, deadline)
                    raise error from None
                logger.warning("weight sync: %s; asking the sender to resend it", exc.reason)
            self.send(("nack", index), deadline, f"asking for bucket {number} again")
            data = self._resent(index, number, deadline)
        raise AssertionError("unreachable")

    def _private_buffer(self) -> torch.Tensor:
        if self._private is None:
            self._private = torch.empty(self._bucket_size_bytes, dtype=torch.uint8)
        return self._private

    def _give_up(self, reason: str, deadline: Deadline) -> None:
        """Tell the sender in place of an ack, then skip the rest of the stream (acking what
        was pushed meanwhile) up to the sender's own ``abort``, so both ends stay in step."""
        with contextlib.suppress(TransportError):
            self.send(("abort", reason), deadline, "reporting a bucket that stayed damaged")
            self.drain(deadline)
        self._sender_aborted, self._in_stream, self._stashed = True, False, None

    def _resent(self, index: int, number: int, deadline: Deadline) -> torch.Tensor:
        """The resent bytes of bucket ``number``; the next bucket's announcement, already on its
        way when the sender heard the nack, is read (and its bytes pulled) and kept for later."""
        waiting = f"waiting for the sender to resend bucket {number}"
        while True:
            message, tensors = self._channel.recv(deadline, waiting, self._bucket_size_bytes, into=self._private_buffer())
            if message[0] == "resend":
                if message[1] != index or len(tensors) != 1 or tensors[0].dtype != torch.uint8:
                    raise WireFormatError(f"expected the bytes of bucket buffer {index} again, got {message!r:.200}")
                return tensors[0]
            if (self._stashed is not None or tensors) and message[0] != "abort":
                raise TransportError(f"protocol out of step {waiting}: got {message[0]!r}")
            announced = self._announcement(message, number + 1)
            if announced is None:
                raise TransportError(f"protocol out of step {waiting}: the stream ended")
            self._stashed = announced, self._transport.pull(announced[0], announced[1], deadline)

    def _ack(self, deadline: Deadline, number: int) -> None:
        assert self._unacked is not None
        self.send(("ack", self._unacked), deadline, f"acking bucket {number}")
        self._unacked = None

    def drain(self, deadline: Deadline) -> None:
        """Skip the rest of the current stream, acking every bucket, so both ends stay in step."""
        number = 0
        if self._unacked is not None:
            self._ack(deadline, number)
        while self._in_stream:
            received = self._next_bucket(deadline, number)
            if received is None:
                return
            self._unacked = received[0][0]
            self._ack(deadline, number)
            number += 1

    def abort(self, reason: str, deadline: Deadline) -> None:
        """Give up on this sync: skip what is left of it, then tell the sender in place of ``done``."""
        if self._sender_aborted:
            return  # the sender gave up first and expects nothing more of this stream
        with contextlib.suppress(TransportError):
            self.drain(deadline)
        with contextlib.suppress(TransportError):  # own short deadline: the sync's may be spent
            self._channel.send(("abort", reason), Deadline(2.0), "reporting an abort")

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):  # wakes a handshake thread still waiting for the sender
            self._channel.sock.shutdown(socket.SHUT_RDWR)
        self._handshake.join(5.0)
        self._channel.close()
        self._transport.close()


class StreamedTensors:
    """What a streaming receiver hands the engine: the tensors, then ``done``; closed early, an abort.

    ``run_receiver`` closes it when the engine fails: the rest of the stream is then skipped
    (bucket by bucket, acked) and the sender hears why in place of ``done``, so both ends
    are in step for the next sync.
    """

    def __init__(
        self,
        stream: StreamReceiver,
        tensors: Generator[tuple[str, torch.Tensor], None, None],
        version: int,
        deadline: Deadline,
    ) -> None:
        self._stream, self._tensors, self._version, self._deadline = stream, tensors, version, deadline
        self._finished = False

    def __iter__(self) -> StreamedTensors:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        try:
            return next(self._tensors)
        except StopIteration:
            self.finish()
            raise
        except BaseException:
            self._finished = True  # the stream itself failed: nothing left to skip or report
            raise

    def load_into(self, engine: Any, version: int) -> None:
        """Hand the tensors to ``engine.update_weights``; subclasses may load them another way."""
        engine.update_weights(self, version)

    def finish(self) -> None:
        """Tell the sender this version is loaded (once, when the tensors run out)."""
        if not self._finished:
            self._finished = True
            self._stream.send(("done", self._version), self._deadline, f"reporting version {self._version}")

    def close(self, reason: str = "the receiving engine stopped before loading every tensor") -> None:
        if self._finished:
            return
        self._finished = True
        self._tensors.close()
        self._stream.abort(f"{reason} (version {self._version})", self._deadline)
