"""Attacks on a weight sync in flight, each reproduced and shown to fail.

A byte flipped on the link, a frame replayed or reordered, a "sender" that does not know the
secret, a client of the torch.distributed store that lists its keys, a peer that writes into
a receiver's Mooncake buffer or a process that writes the shared-memory segment: each is
caught by a MAC check, the damaged bucket is sent again where the transport allows, and the
rollout's weights end equal to the trainer's bit for bit.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
from typing import Any

import pytest
import torch
from weight_sync_attacks import (
    FlippingTcpSender,
    InProcessPair,
    RogueSender,
    listening_addresses,
    sync_in_process,
)
from weight_sync_helpers import BUCKET_SIZE_BYTES, assert_same_weights, make_weights, unavailable_marks

from rl_train.engines.weight_sync import auth, stream
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.errors import IntegrityError, PeerRefusedError, TransportError
from rl_train.engines.weight_sync.transports import mooncake, shm, tcp, torch_dist
from rl_train.engines.weight_sync.wire import Channel, Deadline


def config(transport: str, **fields: Any) -> WeightSyncConfig:
    return WeightSyncConfig(
        backend="bucketed",
        transport=transport,
        bucket_size_bytes=BUCKET_SIZE_BYTES,
        timeout_seconds=20.0,
        host="127.0.0.1",
        **fields,
    )


def test_a_bucket_flipped_on_the_link_is_rejected_resent_and_lands_exact(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tcp, "Sender", FlippingTcpSender)
    weights = make_weights(3)
    with caplog.at_level(logging.WARNING):
        result = sync_in_process(config("tcp"), weights, versions=2)
    assert result["error"] is None and result["sender_error"] is None, result
    assert_same_weights(result["weights"], weights)
    assert result["sender"]._stream.num_resent == 1
    assert result["receiver"]._stream.num_rejected == 1
    assert "failed its MAC check" in caplog.text and "resending it (1 of 3)" in caplog.text


def test_a_bucket_damaged_every_time_fails_the_sync_after_bounded_resends_and_the_next_sync_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp, "Sender", FlippingTcpSender)
    monkeypatch.setattr(stream, "MAX_RESENDS", 2)
    pair = InProcessPair(config("tcp"))
    try:
        with monkeypatch.context() as flipping:
            resends = _flip_resends(flipping)
            result = pair.sync(make_weights(0), 1)
        assert isinstance(result["error"], IntegrityError), result
        assert "bucket 0 of stream 0 (version 1, buffer 0) failed its MAC check" in str(result["error"])
        assert "still damaged after 2 resends" in str(result["error"])
        assert isinstance(result["sender_error"], TransportError), result
        assert resends["count"] == 2 and result["weights"] == {}
        weights = make_weights(1)  # the link is clean again: the same pair syncs
        result = pair.sync(weights, 2)
        assert result["error"] is None and result["sender_error"] is None, result
        assert_same_weights(result["weights"], weights)
    finally:
        pair.close()


def _flip_resends(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Damage every resend too (the link keeps flipping), counting them."""
    counter = {"count": 0}
    original = Channel.send

    def send(self: Channel, message: Any, deadline: Deadline, waiting_for: str, tensors: Any = ()) -> None:
        if message[0] == "resend":
            counter["count"] += 1
            tensors = [tensors[0].clone()]
            tensors[0][0] ^= 0x80
        original(self, message, deadline, waiting_for, tensors)

    monkeypatch.setattr(Channel, "send", send)
    return counter


def sealed_pair() -> tuple[Channel, Channel]:
    left, right = socket.socketpair()
    sender, receiver = Channel(left), Channel(right)
    sender.seal(b"k" * 32, b"j" * 32)
    receiver.seal(b"j" * 32, b"k" * 32)
    return sender, receiver


class Tap:
    """Keeps the raw bytes of every frame sent through a channel's socket, as a peer on the
    link would record them; ``real`` writes onto that link directly."""

    def __init__(self, channel: Channel, deliver: bool = True) -> None:
        self.frames: list[bytes] = []
        self.real = channel.sock
        self.deliver = deliver
        channel.sock = self  # type: ignore[assignment]

    def settimeout(self, seconds: float | None) -> None:
        self.real.settimeout(seconds)

    def sendall(self, data: Any) -> None:
        self.frames.append(bytes(data))
        if self.deliver:
            self.real.sendall(data)


def test_a_replayed_frame_is_refused() -> None:
    sender, receiver = sealed_pair()
    tap = Tap(sender)
    deadline = Deadline(5.0)
    for number in range(2):
        sender.send(("ack", number), deadline, "in the test")
        assert receiver.recv_message(deadline, "in the test") == ("ack", number)
    tap.real.sendall(tap.frames[0])  # the recording of frame 0, where frame 2 is due
    with pytest.raises(IntegrityError, match="frame 2 in the test failed its MAC check: forged, replayed"):
        receiver.recv_message(deadline, "in the test")
    tap.real.close()
    receiver.close()


def test_reordered_frames_are_refused() -> None:
    sender, receiver = sealed_pair()
    tap = Tap(sender, deliver=False)  # the link holds the frames and delivers them out of order
    deadline = Deadline(5.0)
    for number in range(3):
        sender.send(("ack", number), deadline, "in the test")
    for number in (0, 2, 1):
        tap.real.sendall(tap.frames[number])
    assert receiver.recv_message(deadline, "in the test") == ("ack", 0)
    with pytest.raises(IntegrityError, match="frame 1 in the test failed its MAC check"):
        receiver.recv_message(deadline, "in the test")
    tap.real.close()
    receiver.close()


def test_a_forged_frame_from_a_peer_without_the_keys_is_refused() -> None:
    sender, receiver = sealed_pair()
    forged = Channel(sender.sock)
    forged.seal(b"x" * 32, b"y" * 32)  # speaks the protocol, does not know the keys
    forged.send(("end", 0), Deadline(5.0), "in the test")
    with pytest.raises(IntegrityError, match="frame 0 in the test failed its MAC check"):
        receiver.recv_message(Deadline(5.0), "in the test")
    sender.close()
    receiver.close()


def test_a_receiver_drops_a_sender_that_cannot_prove_the_secret_and_reveals_nothing() -> None:
    rogue = RogueSender()
    cfg = config("tcp")
    descriptor = {
        "transport": "tcp",
        "secret": auth.new_secret(),
        "host": "127.0.0.1",
        "port": rogue.port,
        "bucket_size_bytes": BUCKET_SIZE_BYTES,
    }
    from rl_train.engines.weight_sync.backends import build_weight_sync_backend

    receiver = build_weight_sync_backend(cfg).build_receiver(descriptor)
    try:
        with pytest.raises(PeerRefusedError, match="did not prove the secret of this receiver's descriptor"):
            receiver.receive(None, 10.0)
    finally:
        receiver.close()
        rogue.join()
    secret = bytes.fromhex(descriptor["secret"])
    assert rogue.received  # it heard the hello, and nothing after it
    assert secret not in rogue.received and descriptor["secret"].encode() not in rogue.received
    assert b'"proof"' not in bytes(rogue.received)


def test_the_store_binds_the_sender_address_only() -> None:
    sender = torch_dist.Sender(4096, "127.0.0.1", {})
    try:
        port = sender.descriptor()["store_port"]
        addresses = list(listening_addresses(port))
        assert addresses == ["0100007F"], addresses  # 127.0.0.1, and no 0.0.0.0 or [::]
    finally:
        sender.close()


pytestmark_torch_dist = unavailable_marks("torch_dist")


@pytest.mark.parametrize("_", [pytest.param(None, marks=pytestmark_torch_dist)])
def test_listing_the_store_keys_gives_nothing_to_join_or_inject_with(_: None) -> None:
    from torch.distributed import TCPStore

    key = auth.derive(b"s" * 32, b"transport", b"n" * 32)
    sender = torch_dist.Sender(4096, "127.0.0.1", {})
    port = sender.descriptor()["store_port"]
    honest = torch_dist.authenticated_store(sender._store, key)
    honest.set("rank_0", b"10.0.0.1:4242")  # what a rendezvous writes: each rank's address
    honest.set("rank_1", b"10.0.0.2:4242")
    rogue = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    try:
        names = sorted(rogue.list_keys())
        assert len(names) == 2 and all(name.startswith("rlws/") and "rank" not in name for name in names), names
        values = [rogue.get(name) for name in names]
        assert not any(b"10.0.0" in value[: len(value) - 12] for value in values)  # only the value itself
        rogue.set(names[0], b"\x00" * 32 + b"6.6.6.6:4242")  # point a rank at the rogue
        rogue.set(names[1], values[0])  # replay a genuine value under another name
        for rank in ("rank_0", "rank_1"):
            with pytest.raises(IntegrityError, match="failed its MAC check"):
                honest.get(rank)
        guessed = torch_dist.authenticated_store(rogue, b"g" * 32)  # a key of its own: names of its own
        guessed.set("rank_0", b"6.6.6.6:4242")
        assert len(rogue.list_keys()) == 3
    finally:
        sender.close()


@pytest.mark.parametrize("_", [pytest.param(None, marks=pytestmark_torch_dist)])
def test_a_rank_without_the_secret_cannot_join_the_group(_: None) -> None:
    """Rank 1 knows the port and the protocol, not the key: the rendezvous fails for both."""
    from torch.distributed import TCPStore

    sender = torch_dist.Sender(4096, "127.0.0.1", {})
    port = sender.descriptor()["store_port"]
    errors: dict[int, BaseException] = {}

    def join(rank: int, key: bytes) -> None:
        base = sender._store if rank == 0 else TCPStore("127.0.0.1", port, is_master=False)
        try:
            torch_dist._group(torch_dist.authenticated_store(base, key), rank, 2, 5.0)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors[rank] = exc

    threads = [threading.Thread(target=join, args=(0, b"a" * 32)), threading.Thread(target=join, args=(1, b"b" * 32))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    sender.close()
    assert set(errors) == {0, 1}, errors


@pytest.mark.parametrize("_", [pytest.param(None, marks=pytestmark_torch_dist)])
def test_torch_dist_syncs_through_the_authenticated_store(_: None) -> None:
    weights = make_weights(5)
    result = sync_in_process(config("torch_dist"), weights)
    assert result["error"] is None and result["sender_error"] is None, result
    assert_same_weights(result["weights"], weights)


class OverwrittenMooncakeReceiver(mooncake.Receiver):
    """A Mooncake receiver whose first bucket is overwritten, after the sender's write, by a
    rogue Mooncake engine that learnt the session address and buffer addresses."""

    def __init__(self, descriptor: dict[str, Any]) -> None:
        super().__init__(descriptor)
        self.overwritten = 0

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        if not self.overwritten and nbytes:
            self.overwritten += 1
            hello = self.hello()
            rogue = mooncake.start_engine("127.0.0.1")
            junk = torch.full((nbytes,), 0xAB, dtype=torch.uint8)
            assert rogue.register_memory(junk.data_ptr(), nbytes) == 0
            status = rogue.transfer_sync_write(hello["session"], junk.data_ptr(), hello["addresses"][index], nbytes)
            assert status == 0, "the rogue write went through: Mooncake checks no identity"
            rogue.unregister_memory(junk.data_ptr())
        return super().pull(index, nbytes, deadline)


@pytest.mark.parametrize("_", [pytest.param(None, marks=unavailable_marks("mooncake"))])
def test_a_rogue_write_into_a_mooncake_buffer_is_rejected_and_the_bucket_resent(
    _: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mooncake, "Receiver", OverwrittenMooncakeReceiver)
    weights = make_weights(7)
    result = sync_in_process(config("mooncake"), weights)
    assert result["error"] is None and result["sender_error"] is None, result
    assert_same_weights(result["weights"], weights)
    assert result["sender"]._stream.num_resent == 1
    assert result["receiver"]._stream._transport.overwritten == 1


class OverwrittenShmReceiver(shm.Receiver):
    """A process of the same user writes into the shared segment after the sender packed it."""

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        view = super().pull(index, nbytes, deadline)
        if nbytes:
            view[0] ^= 0xFF
        return view


def test_a_write_into_the_shm_segment_is_detected_and_cannot_be_repaired(monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment is the sender's only copy: resending re-reads the damaged bytes, so the sync
    fails after the bounded resends, naming the bucket, and nothing damaged reaches the engine."""
    monkeypatch.setattr(shm, "Receiver", OverwrittenShmReceiver)
    result = sync_in_process(config("shm"), make_weights(0))
    assert isinstance(result["error"], IntegrityError), result
    assert "bucket 0 of stream 0" in str(result["error"])
    assert result["weights"] == {}


def test_a_receiver_closed_before_its_first_sync_leaves_no_handshake_waiting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pair = InProcessPair(config("tcp"))
    stream_receiver = pair.receiver._stream  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING):
        pair.receiver.close()  # the receiver first: a sender gone first is a loss worth its warning
        pair.sender.close()
    assert not stream_receiver._handshake.is_alive()
    assert "dropped the connection" not in caplog.text


class OverwrittenMooncakeSender(mooncake.Sender):
    """A rogue Mooncake engine writes into the sender's own registered bucket buffer after the
    bucket was tagged, just before the sender writes it out (Mooncake checks no identity)."""

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        if nbytes and not getattr(self, "overwritten", False):
            self.overwritten = True
            rogue = mooncake.start_engine("127.0.0.1")
            junk = torch.full((nbytes,), 0x5A, dtype=torch.uint8)
            assert rogue.register_memory(junk.data_ptr(), nbytes) == 0
            session = f"127.0.0.1:{self._engine.get_rpc_port()}"
            assert rogue.transfer_sync_write(session, junk.data_ptr(), self.buffers[index].data_ptr(), nbytes) == 0
            rogue.unregister_memory(junk.data_ptr())
        super().push(index, nbytes, deadline)


@pytest.mark.parametrize("_", [pytest.param(None, marks=unavailable_marks("mooncake"))])
def test_a_rogue_write_into_the_mooncake_senders_buffer_is_caught_not_repaired(
    _: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The damage sits in the sender's only copy of the bucket, so the resends carry it too:
    the sync fails naming the bucket, and no damaged byte reaches the engine."""
    monkeypatch.setattr(mooncake, "Sender", OverwrittenMooncakeSender)
    monkeypatch.setattr(mooncake, "DIRECT_MIN_BYTES", 1 << 40)  # every chunk in the staging buffer
    result = sync_in_process(config("mooncake"), make_weights(2))
    assert isinstance(result["error"], IntegrityError), result
    assert "bucket 0 of stream 0" in str(result["error"]) and "still damaged after 3 resends" in str(result["error"])
    assert result["weights"] == {}
