"""One bucketed stream of named tensors from a sender to N receivers, over any transport.

Protocol on each receiver's control socket (sender -> receiver unless marked):
``hello(token, transport hello)`` (receiver -> sender, once), ``welcome`` (once), then per stream ``begin(header)``,
``bucket(index, nbytes, chunks)`` per bucket, ``end(num_buckets)``; the receiver answers
every bucket with ``ack(index)`` once it has copied the bytes out, which frees that buffer.
A background thread pushes bucket k while the caller packs bucket k+1 into the other
buffer; before a buffer is reused, the packer waits for every receiver's ack of it.

The descriptor carries a random per-sender token. A connection whose hello does not
present it (a stray client, a receiver of another run, garbage) is answered ``refused``
and closed, and the sender goes on accepting until its own receivers are in.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import socket
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from rl_train.engines.weight_sync import wire
from rl_train.engines.weight_sync.buckets import ChunkMeta, pack_buckets
from rl_train.engines.weight_sync.errors import PeerRefusedError, TransportError
from rl_train.engines.weight_sync.frame import Message
from rl_train.engines.weight_sync.transports import PlacesDirect, get_transport
from rl_train.engines.weight_sync.wire import Deadline

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_SECONDS = 5.0
"""How long an accepted connection may take to say hello before it is dropped, so that a
silent client cannot hold the place of a real receiver for the whole sync timeout."""
HELLO_MAX_META_BYTES = 64 << 10
"""Cap on a hello, read before the peer has shown the token."""


class StreamSender:
    def __init__(
        self, transport: str, bucket_size_bytes: int, num_receivers: int, host: str, options: dict[str, Any]
    ) -> None:
        self._transport = get_transport(transport).Sender(bucket_size_bytes, host, options)
        self._server = wire.listen(host)
        self._num_receivers = num_receivers
        self._conns: list[socket.socket] = []
        self._pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-push")
        self._token = secrets.token_hex(32)
        self.num_refused = 0
        """Connections refused so far (no token, a wrong one, or not speaking the protocol)."""
        self._descriptor = {
            "transport": transport,
            "token": self._token,
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
        while len(self._conns) < self._num_receivers:
            waiting = f"waiting for receiver {len(self._conns) + 1} of {self._num_receivers} to connect"
            conn = wire.accept(self._server, deadline, waiting)
            own = Deadline(min(HELLO_TIMEOUT_SECONDS, deadline.remaining(waiting)))
            try:
                hellos.append(self._hello(conn, own))
            except TransportError as exc:  # this peer only: the sync goes on without it
                self._refuse(conn, exc)
                continue
            self._conns.append(conn)
        for conn, welcome in zip(self._conns, self._transport.plan(hellos), strict=True):
            wire.send_message(conn, ("welcome", welcome), deadline, "sending the welcome")
        self._transport.attach(self._conns, deadline)

    def _hello(self, conn: socket.socket, deadline: Deadline) -> dict[str, Any]:
        """The transport hello of a peer that presents this sender's token."""
        waiting = "waiting for a connected peer's hello"
        message = wire.recv_message(conn, deadline, waiting, max_meta_bytes=HELLO_MAX_META_BYTES)
        token, hello = wire.expect(message, "hello", waiting)
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            raise PeerRefusedError("the peer did not present this sender's token (from its descriptor)")
        return hello

    def _refuse(self, conn: socket.socket, reason: TransportError) -> None:
        self.num_refused += 1
        logger.warning("weight sync: refused a connection to the sender: %s", reason)
        with contextlib.suppress(TransportError):
            wire.send_message(conn, ("refused", reason.reason), Deadline(1.0), "refusing a peer")
        conn.close()

    def broadcast(self, message: Message, deadline: Deadline, waiting_for: str) -> None:
        for rank, conn in enumerate(self._conns):
            wire.send_message(conn, message, deadline, f"{waiting_for} (receiver {rank})")

    def gather(self, kind: str, deadline: Deadline, waiting_for: str) -> list[Message]:
        """One ``kind`` message from every receiver; an ``abort`` from one raises with its reason."""
        replies, aborted = [], []
        for rank, conn in enumerate(self._conns):  # read every receiver's reply so all stay in step
            what = f"waiting for receiver {rank} {waiting_for}"
            message = wire.recv_message(conn, deadline, what)
            if message[0] == "abort":
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
        places_direct = isinstance(self._transport, PlacesDirect)
        direct = self._transport.place_direct if places_direct else None

        def acquire(index: int) -> None:
            future = in_flight.pop(index, None)
            if future is not None:
                self._wait(future, deadline, f"pushing bucket buffer {index}")
                self.gather(
                    "ack", deadline, f"to release bucket buffer {index} (version {header.get('version')})"
                )
            if places_direct:  # what a bucket that was never pushed left behind goes too
                self._transport.release(index)

        def emit(index: int, nbytes: int, chunks: list[ChunkMeta]) -> None:
            in_flight[index] = self._pusher.submit(
                self._push, index, nbytes, chunks, counter["bucket"], deadline
            )
            counter["bucket"] += 1
            counter["bytes"] += nbytes

        try:
            num_buckets = pack_buckets(named_tensors, self._transport.buffers, acquire, emit, direct)
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
        message = ("bucket", index, nbytes, [chunk.to_wire() for chunk in chunks])
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
