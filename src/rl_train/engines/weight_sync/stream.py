"""One bucketed stream of named tensors from a sender to N receivers, over any transport.

Protocol on each receiver's control socket (sender -> receiver unless marked): the
handshake of ``auth.py`` (``hello``, ``challenge``, ``proof``: once), ``welcome`` (once),
then per stream ``begin(header)``, ``bucket(index, nbytes, chunks, tag)`` per bucket,
``end(num_buckets)``; the receiver answers every bucket with ``ack(index)`` once it has
copied the bytes out, which frees that buffer. A background thread pushes bucket k while
the caller packs bucket k+1 into the other buffer; before a buffer is reused, the packer
waits for every receiver's ack of it.

A bucket whose bytes fail their tag at a receiver is answered ``nack(index)``; the sender
then sends those bytes again on that receiver's control channel (``resend``), at most
``MAX_RESENDS`` times, and fails the sync naming the bucket after that.

The descriptor carries the per-run secret. A connection that does not prove it (a stray
client, a receiver of another run, garbage) is answered ``refused`` and closed, and the
sender goes on accepting until its own receivers are in.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from rl_train.engines.weight_sync import auth, wire
from rl_train.engines.weight_sync.buckets import ChunkMeta, pack_buckets
from rl_train.engines.weight_sync.errors import IntegrityError, TransportError
from rl_train.engines.weight_sync.frame import Message
from rl_train.engines.weight_sync.transports import PlacesDirect, get_transport
from rl_train.engines.weight_sync.wire import Channel, Deadline

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_SECONDS = 5.0
"""How long an accepted connection may take over the handshake before it is dropped, so
that a silent client cannot hold the place of a real receiver for the whole sync timeout."""
MAX_RESENDS = 3
"""Times a bucket that failed its tag at a receiver is sent again before the sync fails."""
T = TypeVar("T")


@dataclass
class Bucket:
    """One pushed bucket, as its tag binds it: (version, stream, bucket, buffer, bytes) and its chunks."""

    header: tuple[int, int, int, int, int]
    records: list[Any]
    tag: str = ""


class StreamSender:
    def __init__(
        self, transport: str, bucket_size_bytes: int, num_receivers: int, host: str, options: dict[str, Any]
    ) -> None:
        self._transport = get_transport(transport).Sender(bucket_size_bytes, host, options)
        self._server = wire.listen(host)
        self._num_receivers = num_receivers
        self._conns: list[Channel] = []
        self._pusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-push")
        self._secret_text = auth.new_secret()
        self._secret = bytes.fromhex(self._secret_text)
        self._stream_nonce = secrets.token_bytes(auth.NONCE_BYTES)
        """Fresh per sender: tags of another sender's buckets (a recording) never verify here."""
        self._mac = auth.BucketMac(auth.derive(self._secret, b"buckets", self._stream_nonce))
        self._num_streams = 0
        self.num_refused = 0
        """Connections refused so far (a wrong proof, or not speaking the protocol)."""
        self.num_resent = 0
        """Buckets sent again because a receiver found them damaged."""
        self._descriptor = {
            "transport": transport,
            "secret": self._secret_text,
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
            conn = Channel(wire.accept(self._server, deadline, waiting))
            own = Deadline(min(HELLO_TIMEOUT_SECONDS, deadline.remaining(waiting)))
            try:
                hellos.append(auth.sender_handshake(conn, self._secret, own))
            except TransportError as exc:  # this peer only: the sync goes on without it
                self._refuse(conn, exc)
                continue
            self._conns.append(conn)
        for conn, welcome in zip(self._conns, self._transport.plan(hellos), strict=True):
            welcome = {"stream_nonce": self._stream_nonce.hex(), "transport": welcome}
            conn.send(("welcome", welcome), deadline, "sending the welcome")
        transport_key = auth.derive(self._secret, b"transport", self._stream_nonce)
        self._transport.attach(self._conns, deadline, transport_key)

    def _refuse(self, conn: Channel, reason: TransportError) -> None:
        """Drop a peer that did not prove the secret; it never sees a welcome, let alone a weight."""
        self.num_refused += 1
        peer = "an unknown peer"
        with contextlib.suppress(OSError):
            peer = "{}:{}".format(*conn.sock.getpeername()[:2])
        logger.warning("weight sync: refused a connection to the sender from %s: %s", peer, reason)
        with contextlib.suppress(TransportError):
            wire.send_message(conn.sock, ("refused", reason.reason), Deadline(1.0), "refusing a peer")
        conn.close()

    def broadcast(self, message: Message, deadline: Deadline, waiting_for: str) -> None:
        for rank, conn in enumerate(self._conns):
            conn.send(message, deadline, f"{waiting_for} (receiver {rank})")

    def gather(self, kind: str, deadline: Deadline, waiting_for: str) -> list[Message]:
        """One ``kind`` message from every receiver; an ``abort`` from one raises with its reason."""
        replies, aborted = [], []
        for rank, conn in enumerate(self._conns):  # read every receiver's reply so all stay in step
            what = f"waiting for receiver {rank} {waiting_for}"
            message = conn.recv_message(deadline, what)
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
        stream, self._num_streams = self._num_streams, self._num_streams + 1
        in_flight: dict[int, Future[Bucket]] = {}
        counter = {"bucket": 0, "bytes": 0}
        places_direct = isinstance(self._transport, PlacesDirect)
        direct = self._transport.place_direct if places_direct else None

        def acquire(index: int) -> None:
            future = in_flight.pop(index, None)
            if future is not None:
                self._settle(self._wait(future, deadline, f"pushing bucket buffer {index}"), deadline)
            if places_direct:  # what a bucket that was never pushed left behind goes too
                self._transport.release(index)

        def emit(index: int, nbytes: int, chunks: list[ChunkMeta]) -> None:
            bucket = Bucket(
                (int(header.get("version", 0)), stream, counter["bucket"], index, nbytes),
                [chunk.to_wire() for chunk in chunks],
            )
            # tagged here, in the packer's thread, so that the tag of bucket k+1 is taken while
            # the pusher still moves bucket k: on a link slower than the tag, it costs no time
            bucket.tag = self._mac.tag(bucket.header, bucket.records, self._pieces(index, nbytes))
            in_flight[index] = self._pusher.submit(self._push, bucket, deadline)
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

    def _pieces(self, index: int, nbytes: int) -> list[torch.Tensor]:
        """The bytes of bucket ``index`` in order, wherever the transport keeps them."""
        if isinstance(self._transport, PlacesDirect):
            return self._transport.pieces(index, nbytes)
        return [self._transport.buffers[index][:nbytes]]

    def _push(self, bucket: Bucket, deadline: Deadline) -> Bucket:
        """Send a tagged bucket on (in this thread, beside the packer).

        The tag was taken before the transport moves anything: a write into the sender's own
        buffers after that point (Mooncake lets any peer write registered memory) then fails
        the receivers' check instead of travelling under a tag that matches it.
        """
        _, _, number, index, nbytes = bucket.header
        if self._transport.data_before_meta:
            self._transport.push(index, nbytes, deadline)
        self.broadcast(("bucket", index, nbytes, bucket.records, bucket.tag), deadline, f"announcing bucket {number}")
        if not self._transport.data_before_meta:
            self._transport.push(index, nbytes, deadline)
        return bucket

    def _settle(self, bucket: Bucket, deadline: Deadline) -> None:
        """Every receiver's ack of ``bucket``; one that found it damaged (``nack``) gets its
        bytes again on its own control channel, up to ``MAX_RESENDS`` times."""
        version, _, number, index, _ = bucket.header
        waiting, aborted = f"to release bucket buffer {index} (version {version})", []
        for rank, conn in enumerate(self._conns):  # read every receiver's reply so all stay in step
            what = f"waiting for receiver {rank} {waiting}"
            message = conn.recv_message(deadline, what)
            for attempt in range(1, MAX_RESENDS + 2):
                if message[0] != "nack":
                    break
                if attempt > MAX_RESENDS:
                    raise IntegrityError(
                        f"bucket {number} of version {version} failed its MAC check at receiver {rank} "
                        f"{attempt} times (sent once, resent {MAX_RESENDS} times); giving up"
                    )
                logger.warning(
                    "weight sync: receiver %d rejected bucket %d of version %d (MAC check failed); "
                    "resending it (%d of %d)", rank, number, version, attempt, MAX_RESENDS,
                )
                self.num_resent += 1
                self._wait(self._pusher.submit(self._resend, conn, bucket, deadline), deadline, "resending")
                message = conn.recv_message(deadline, what)
            if message[0] == "abort":
                aborted.append(f"receiver {rank} aborted the sync: {message[1]}")
                continue
            wire.expect(message, "ack", what)
        if aborted:
            raise TransportError("; ".join(aborted))

    def _resend(self, conn: Channel, bucket: Bucket, deadline: Deadline) -> None:
        """The bucket's bytes on the control channel (in the pusher thread, so that frames on
        one socket never interleave): the transport's own path may be the one that damages them."""
        _, _, number, index, nbytes = bucket.header
        pieces = [piece.cpu() for piece in self._pieces(index, nbytes)]
        data = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        conn.send(("resend", index), deadline, f"resending bucket {number}", [data])

    def _abort(self, in_flight: dict[int, Future[Bucket]], reason: str) -> None:
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
    def _wait(future: Future[T], deadline: Deadline, waiting_for: str) -> T:
        try:
            return future.result(timeout=deadline.remaining(waiting_for))
        except FutureTimeout as exc:
            raise TransportError(f"timed out after {deadline.timeout_seconds:.1f} s {waiting_for}") from exc

    def close(self) -> None:
        self._pusher.shutdown(wait=False, cancel_futures=True)
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._server.close()
        self._transport.close()
