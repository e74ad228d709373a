"""The sender serves only the receivers of its own run: a peer that cannot prove the run's
secret is refused, and a receiver drops a "sender" that cannot prove it.

Every refused or broken connection costs the sender that connection only: it logs why,
answers ``refused`` where it can, and goes on accepting until its real receivers are in.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator

import pytest
from weight_sync_helpers import BUCKET_SIZE_BYTES, assert_same_weights, make_weights
from weight_sync_peers import Peer, pack_tensors, unpack_tensors

from rl_train.engines.weight_sync import frame, stream
from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.base import WeightSender
from rl_train.engines.weight_sync.boundaries import run_sender
from rl_train.engines.weight_sync.config import WeightSyncConfig


@pytest.fixture
def sender() -> Iterator[tuple[WeightSyncConfig, WeightSender]]:
    cfg = WeightSyncConfig(
        backend="bucketed", transport="tcp", bucket_size_bytes=BUCKET_SIZE_BYTES, timeout_seconds=20.0
    )
    built = build_weight_sync_backend(cfg).build_sender()
    yield cfg, built
    built.close()


def open_receiver(peer: Peer, cfg: WeightSyncConfig, descriptor: dict) -> str:
    key = uuid.uuid4().hex
    reply = peer.call("open", key, cfg.model_dump(), descriptor, pack_tensors(make_weights(0)), False)
    assert reply == ("ok",), reply
    return key


def sync_one(peer: Peer, sender: WeightSender, key: str, version: int) -> tuple:
    weights = make_weights(version)
    peer.request("sync", key, version, None, 20.0)
    try:
        run_sender(sender, lambda: iter(weights.items()), version)
    finally:
        reply = peer.reply(30.0)
    assert reply[0] == "ok", reply
    assert_same_weights(unpack_tensors(reply[2]), weights)
    return reply


def test_the_descriptor_carries_a_fresh_random_secret(sender) -> None:
    cfg, first = sender
    second = build_weight_sync_backend(cfg).build_sender()
    try:
        secrets = [first.descriptor()["secret"], second.descriptor()["secret"]]
        assert all(isinstance(secret, str) and len(secret) == 64 for secret in secrets)
        assert secrets[0] != secrets[1]
        assert "token" not in first.descriptor()
    finally:
        second.close()


def test_a_receiver_with_the_wrong_secret_is_refused_and_the_right_one_still_syncs(
    peer: Peer, sender, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, built = sender
    descriptor = built.descriptor()
    impostor = open_receiver(peer, cfg, descriptor | {"secret": "0" * 64})  # connects first
    genuine = open_receiver(peer, cfg, descriptor)
    with caplog.at_level(logging.WARNING):
        sync_one(peer, built, genuine, 1)
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert "waiting for the peer's answer to the challenge" in refusals[0]  # it never answered
    reply = peer.call("sync", impostor, 1, None, 5.0)
    assert reply[:2] == ("error", "PeerRefusedError"), reply
    assert "did not prove the secret of this receiver's descriptor" in reply[2]
    sync_one(peer, built, genuine, 2)  # and it keeps serving


def test_a_receiver_without_a_secret_cannot_even_connect(peer: Peer, sender) -> None:
    cfg, built = sender
    descriptor = {k: v for k, v in built.descriptor().items() if k != "secret"}
    reply = peer.call("open", uuid.uuid4().hex, cfg.model_dump(), descriptor, pack_tensors(make_weights(0)), False)
    assert reply[:2] == ("error", "PeerRefusedError"), reply
    assert "carries no valid run secret" in reply[2]


def test_garbage_and_silent_connections_do_not_stop_the_sender(
    peer: Peer, sender, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stream, "HELLO_TIMEOUT_SECONDS", 0.5)
    cfg, built = sender
    descriptor = built.descriptor()
    address = (descriptor["host"], descriptor["port"])
    strays = [socket.create_connection(address) for _ in range(4)]
    strays[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a web client
    strays[1].sendall(b"\x80\x04\x95\x10" + bytes(60))  # a pickle
    strays[2].sendall(frame.HEADER.pack(frame.MAGIC, frame.FORMAT_VERSION, 2**31, 0))  # a 2 GiB hello
    # strays[3] says nothing at all
    genuine = open_receiver(peer, cfg, descriptor)
    try:
        with caplog.at_level(logging.WARNING):
            sync_one(peer, built, genuine, 1)
    finally:
        for stray in strays:
            stray.close()
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 4, refusals
    assert any("bad magic b'GET '" in text for text in refusals)
    assert any("over the cap of 65536" in text for text in refusals)
    assert any("timed out after 0.5 s" in text for text in refusals)
