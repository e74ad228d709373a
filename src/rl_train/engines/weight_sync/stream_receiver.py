"""The receiving end of a bucketed stream (protocol in ``stream.py``).

Tensors come out as the engine asks for them; whole tensors are views of the bucket
buffer, lent until the next one is requested, so a receiver adds no copy of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

from rl_train.engines.weight_sync import wire
from rl_train.engines.weight_sync.buckets import ChunkMeta, TensorAssembler
from rl_train.engines.weight_sync.errors import TransportError, WireFormatError
from rl_train.engines.weight_sync.frame import Message
from rl_train.engines.weight_sync.transports import get_transport
from rl_train.engines.weight_sync.wire import Deadline


class StreamReceiver:
    """Connects at construction (so the sender can count it) and finishes the handshake lazily.

    The hello presents the sender's token from the descriptor; a sender that does not know
    it answers ``refused``, which ``begin`` raises as ``PeerRefusedError``.
    """

    def __init__(self, descriptor: dict[str, Any], connect_timeout_seconds: float) -> None:
        self._descriptor = descriptor
        self._bucket_size_bytes = int(descriptor["bucket_size_bytes"])
        self._transport = get_transport(descriptor["transport"]).Receiver(descriptor)
        deadline = Deadline(connect_timeout_seconds)
        where = f"{descriptor['host']}:{descriptor['port']}"
        self._sock = wire.connect(
            descriptor["host"], descriptor["port"], deadline, f"to the sender at {where}"
        )
        wire.send_message(
            self._sock,
            ("hello", str(descriptor.get("token", "")), self._transport.hello()),
            deadline,
            "saying hello to the sender",
        )
        self._attached = False
        self._sender_aborted = False
        self._in_stream = False
        self._unacked: int | None = None

    def send(self, message: Message, deadline: Deadline, waiting_for: str) -> None:
        wire.send_message(self._sock, message, deadline, waiting_for)

    def recv(self, kind: str, deadline: Deadline, waiting_for: str) -> Message:
        return wire.expect(self.recv_any(deadline, waiting_for), kind, waiting_for)

    def recv_any(self, deadline: Deadline, waiting_for: str) -> Message:
        return wire.recv_message(self._sock, deadline, waiting_for)

    def begin(self, deadline: Deadline) -> dict[str, Any]:
        """Wait for the next stream's header (the welcome first, on the first sync)."""
        if not self._attached:
            waiting = "waiting for the sender's welcome (the sender has not started its first sync)"
            (welcome,) = self.recv("welcome", deadline, waiting)
            self._transport.attach(welcome, self._sock, deadline)
            self._attached = True
        (header,) = self.recv("begin", deadline, "waiting for the sender to begin a sync")
        if type(header.get("version")) is not int or not isinstance(header.get("kind"), str):
            raise WireFormatError(f"stream header {header!r:.200} needs an integer version and a kind")
        self._sender_aborted, self._in_stream = False, True
        return header

    def tensors(self, deadline: Deadline) -> Generator[tuple[str, torch.Tensor], None, None]:
        """The stream's tensors, acked bucket by bucket.

        Each tensor is valid until the next one is requested (whole tensors are views of the
        bucket buffer, which the sender refills after the ack): consume, or copy, as you go.
        """
        assembler = TensorAssembler()
        number = 0
        while True:
            message = self._next_bucket(deadline, number)
            if message is None:
                assembler.finish()
                return
            index, nbytes, chunks = message
            bucket = self._transport.pull(index, nbytes, deadline)
            self._unacked = index
            yield from assembler.add_bucket(bucket, chunks)  # views: consumed before the ack
            self._ack(deadline, number)
            number += 1

    def _next_bucket(self, deadline: Deadline, number: int) -> tuple[int, int, list[ChunkMeta]] | None:
        """The next bucket's (index, nbytes, chunks), or ``None`` at the end of the stream."""
        message = wire.recv_message(self._sock, deadline, f"waiting for bucket {number} from the sender")
        if message[0] == "abort":
            self._sender_aborted, self._in_stream = True, False
            raise TransportError(f"the sender aborted the sync at bucket {number}: {message[1]}")
        if message[0] == "end":
            self._in_stream = False
            if message[1] != number:
                raise TransportError(f"the sender sent {message[1]} buckets, {number} arrived")
            return None
        index, nbytes, records = wire.expect(message, "bucket", f"waiting for bucket {number}")
        if index not in (0, 1) or not 0 <= nbytes <= self._bucket_size_bytes:
            raise WireFormatError(
                f"bucket {number} announces buffer {index} with {nbytes} bytes; "
                f"there are buffers 0 and 1 of {self._bucket_size_bytes} bytes"
            )
        return index, nbytes, [ChunkMeta.from_wire(record, nbytes) for record in records]

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
            message = self._next_bucket(deadline, number)
            if message is None:
                return
            index, nbytes, _ = message
            self._transport.pull(index, nbytes, deadline)
            self._unacked = index
            self._ack(deadline, number)
            number += 1

    def abort(self, reason: str, deadline: Deadline) -> None:
        """Give up on this sync: skip what is left of it, then tell the sender in place of ``done``."""
        if self._sender_aborted:
            return  # the sender gave up first and expects nothing more of this stream
        with contextlib.suppress(TransportError):
            self.drain(deadline)
        with contextlib.suppress(TransportError):  # own short deadline: the sync's may be spent
            wire.send_message(self._sock, ("abort", reason), Deadline(2.0), "reporting an abort")

    def close(self) -> None:
        self._sock.close()
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
