"""One bucketed stream of named tensors from a sender to N receivers, over any transport.

Protocol on each receiver's control socket (sender -> receiver unless marked):
``hello`` (receiver -> sender, once), ``welcome`` (once), then per stream ``begin(header)``,
``bucket(index, nbytes, chunks)`` per bucket, ``end(num_buckets)``; the receiver answers
every bucket with ``ack(index)`` once it has copied the bytes out, which frees that buffer.
A background thread pushes bucket k while the caller packs bucket k+1 into the other
buffer; before a buffer is reused, the packer waits for every receiver's ack of it.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from rl_train.engines.weight_sync import wire
from rl_train.engines.weight_sync.boundaries import TransportError
from rl_train.engines.weight_sync.buckets import ChunkMeta, TensorAssembler, pack_buckets
from rl_train.engines.weight_sync.transports import get_transport
from rl_train.engines.weight_sync.wire import Deadline


class StreamSender:
    def __init__(self, transport: str, bucket_size_bytes: int, num_receivers: int, host: str) -> None:
        self._transport = get_transport(transport).Sender(bucket_size_bytes, host)
        self._server = wire.listen(host)
        self._num_receivers = num_receivers
        self._conns: list[socket.socket] = []
        self._pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-push")
        self._descriptor = {
            "transport": transport,
            "host": host,
            "port": self._server.getsockname()[1],
            "bucket_size_bytes": bucket_size_bytes,
            **self._transport.descriptor(),
        }

    def descriptor(self) -> dict[str, Any]:
        return dict(self._descriptor)

    def connect(self, deadline: Deadline) -> None:
        """Accept every receiver (first sync only) and let the transport finish its handshake."""
        if self._conns:
            return
        hellos = []
        for rank in range(self._num_receivers):
            waiting = f"waiting for receiver {rank + 1} of {self._num_receivers} to connect"
            conn = wire.accept(self._server, deadline, waiting)
            self._conns.append(conn)
            hellos.append(wire.expect(wire.recv_message(conn, deadline, waiting), "hello", waiting)[0])
        for conn, welcome in zip(self._conns, self._transport.plan(hellos), strict=True):
            wire.send_message(conn, ("welcome", welcome), deadline, "sending the welcome")
        self._transport.attach(self._conns, deadline)

    def broadcast(self, message: Any, deadline: Deadline, waiting_for: str) -> None:
        for rank, conn in enumerate(self._conns):
            wire.send_message(conn, message, deadline, f"{waiting_for} (receiver {rank})")

    def gather(self, kind: str, deadline: Deadline, waiting_for: str) -> list[tuple[Any, ...]]:
        """One ``kind`` message from every receiver; an ``abort`` from one raises with its reason."""
        replies, aborted = [], []
        for rank, conn in enumerate(self._conns):  # read every receiver's reply so all stay in step
            what = f"waiting for receiver {rank} {waiting_for}"
            message = wire.recv_message(conn, deadline, what)
            if isinstance(message, tuple) and message and message[0] == "abort":
                aborted.append(f"receiver {rank} aborted the sync: {message[1]}")
                continue
            replies.append(wire.expect(message, kind, what))
        if aborted:
            raise TransportError("; ".join(aborted))
        return replies

    def send_stream(
        self, header: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]], deadline: Deadline
    ) -> int:
        """Stream every tensor; returns the bytes packed. Receivers have copied all bytes on return."""
        self.connect(deadline)
        self.broadcast(("begin", header), deadline, "announcing a sync")
        in_flight: dict[int, Future[None]] = {}
        counter = {"bucket": 0, "bytes": 0}

        def acquire(index: int) -> None:
            future = in_flight.pop(index, None)
            if future is None:
                return
            self._wait(future, deadline, f"pushing bucket buffer {index}")
            self.gather(
                "ack", deadline, f"to release bucket buffer {index} (version {header.get('version')})"
            )

        def emit(index: int, nbytes: int, chunks: list[ChunkMeta]) -> None:
            in_flight[index] = self._pusher.submit(
                self._push, index, nbytes, chunks, counter["bucket"], deadline
            )
            counter["bucket"] += 1
            counter["bytes"] += nbytes

        try:
            num_buckets = pack_buckets(named_tensors, self._transport.buffers, acquire, emit)
            for index in list(in_flight):  # insertion order is emission order, the order of the acks
                acquire(index)
        except BaseException as exc:
            self._abort(in_flight, f"{type(exc).__name__}: {exc}")
            raise
        self.broadcast(("end", num_buckets), deadline, "closing a sync")
        return counter["bytes"]

    def _push(
        self, index: int, nbytes: int, chunks: list[ChunkMeta], number: int, deadline: Deadline
    ) -> None:
        message = ("bucket", index, nbytes, chunks)
        if self._transport.data_before_meta:
            self._transport.push(index, nbytes, deadline)
            self.broadcast(message, deadline, f"announcing bucket {number}")
        else:
            self.broadcast(message, deadline, f"announcing bucket {number}")
            self._transport.push(index, nbytes, deadline)

    def _abort(self, in_flight: dict[int, Future[None]], reason: str) -> None:
        """Best effort: tell the receivers this stream is dead, so they fail now rather than time out."""
        for future in in_flight.values():
            future.cancel()
        deadline = Deadline(2.0)
        pushed = []
        for index, future in in_flight.items():
            with contextlib.suppress(Exception):
                future.result(timeout=deadline.remaining("finishing in-flight pushes before an abort"))
                pushed.append(index)
        with contextlib.suppress(Exception):
            self.broadcast(("abort", reason), deadline, "reporting an abort")
            for index in pushed:  # drain their acks so the next sync starts in step
                self.gather("ack", deadline, f"to release bucket buffer {index} after an abort")

    @staticmethod
    def _wait(future: Future[None], deadline: Deadline, waiting_for: str) -> None:
        try:
            future.result(timeout=deadline.remaining(waiting_for))
        except FutureTimeout as exc:
            raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting_for}") from exc

    def close(self) -> None:
        self._pusher.shutdown(wait=False, cancel_futures=True)
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._server.close()
        self._transport.close()


class StreamReceiver:
    """Connects at construction (so the sender can count it) and finishes the handshake lazily."""

    def __init__(self, descriptor: dict[str, Any], connect_timeout_seconds: float) -> None:
        self._descriptor = descriptor
        self._transport = get_transport(descriptor["transport"]).Receiver(descriptor)
        deadline = Deadline(connect_timeout_seconds)
        where = f"{descriptor['host']}:{descriptor['port']}"
        self._sock = wire.connect(
            descriptor["host"], descriptor["port"], deadline, f"to the sender at {where}"
        )
        wire.send_message(
            self._sock, ("hello", self._transport.hello()), deadline, "saying hello to the sender"
        )
        self._attached = False
        self._sender_aborted = False
        self._in_stream = False
        self._unacked: int | None = None

    def send(self, message: Any, deadline: Deadline, waiting_for: str) -> None:
        wire.send_message(self._sock, message, deadline, waiting_for)

    def recv(self, kind: str, deadline: Deadline, waiting_for: str) -> tuple[Any, ...]:
        return wire.expect(self.recv_any(deadline, waiting_for), kind, waiting_for)

    def recv_any(self, deadline: Deadline, waiting_for: str) -> Any:
        return wire.recv_message(self._sock, deadline, waiting_for)

    def begin(self, deadline: Deadline) -> dict[str, Any]:
        """Wait for the next stream's header (the welcome first, on the first sync)."""
        if not self._attached:
            waiting = "waiting for the sender's welcome (the sender has not started its first sync)"
            (welcome,) = self.recv("welcome", deadline, waiting)
            self._transport.attach(welcome, self._sock, deadline)
            self._attached = True
        (header,) = self.recv("begin", deadline, "waiting for the sender to begin a sync")
        self._sender_aborted, self._in_stream = False, True
        return header

    def tensors(self, deadline: Deadline) -> Iterator[tuple[str, torch.Tensor]]:
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

    def _next_bucket(self, deadline: Deadline, number: int) -> tuple[Any, ...] | None:
        """The next bucket's (index, nbytes, chunks), or ``None`` at the end of the stream."""
        message = wire.recv_message(self._sock, deadline, f"waiting for bucket {number} from the sender")
        if isinstance(message, tuple) and message and message[0] == "abort":
            self._sender_aborted, self._in_stream = True, False
            raise TransportError(f"the sender aborted the sync at bucket {number}: {message[1]}")
        if isinstance(message, tuple) and message and message[0] == "end":
            self._in_stream = False
            if message[1] != number:
                raise TransportError(f"the sender sent {message[1]} buckets, {number} arrived")
            return None
        return wire.expect(message, "bucket", f"waiting for bucket {number}")

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
        tensors: Iterator[tuple[str, torch.Tensor]],
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
            if not self._finished:
                self._finished = True
                self._stream.send(
                    ("done", self._version), self._deadline, f"reporting version {self._version}"
                )
            raise
        except BaseException:
            self._finished = True  # the stream itself failed: nothing left to skip or report
            raise

    def close(self, reason: str = "the receiving engine stopped before loading every tensor") -> None:
        if self._finished:
            return
        self._finished = True
        self._tensors.close()
        self._stream.abort(f"{reason} (version {self._version})", self._deadline)
