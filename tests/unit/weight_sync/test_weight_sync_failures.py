"""A dead or silent peer fails with a timeout/connection error that names the boundary and the wait."""

from __future__ import annotations

import pytest
from weight_sync_helpers import (
    assert_same_weights,
    available_transports,
    bucketed_pairs,
    make_weights,
    transport_params,
)
from weight_sync_pair import SyncPair
from weight_sync_peers import Peer

from rl_train.engines.weight_sync.boundaries import ExportError, TransportError, run_sender


@pytest.fixture(scope="module")
def dead_receivers() -> dict[str, SyncPair]:
    """A receiver per transport, connected to its sender, in a process that is then killed."""
    victim = Peer()
    weights = make_weights(0)
    pairs = {
        name: SyncPair(victim, "bucketed", name, weights, timeout_seconds=3.0) for name in available_transports()
    }
    victim.process.kill()
    victim.process.join(5)
    yield pairs
    for pair in pairs.values():
        pair.close()


@pytest.mark.parametrize("transport", transport_params())
def test_dead_receiver_fails_the_sender_at_transport(
    dead_receivers: dict[str, SyncPair], transport: str
) -> None:
    pair = dead_receivers[transport]
    weights = make_weights(0)
    with pytest.raises(TransportError) as failure:
        run_sender(pair.sender, lambda: iter(weights.items()), 1)
    message = str(failure.value)
    assert "boundary 'transport'" in message
    assert "receiver" in message or "peer" in message or "process group" in message, message


def test_sender_that_never_starts_times_out_the_receiver(peer: Peer) -> None:
    pair = SyncPair(peer, "bucketed", "tcp", make_weights(0), timeout_seconds=1.0)
    try:
        reply = peer.call("sync", pair.key, 1, None, 1.0)
        assert reply[:2] == ("error", "TransportError"), reply
        assert "boundary 'transport'" in reply[2]
        assert "timed out after 1.0 s waiting for the sender's welcome" in reply[2]
    finally:
        pair.close()


def test_sender_that_died_fails_the_receiver_naming_the_wait(peer: Peer) -> None:
    pair = SyncPair(peer, "bucketed", "shm", make_weights(0), timeout_seconds=5.0)
    pair.sender.close()
    reply = peer.call("sync", pair.key, 1, None, 5.0)
    assert reply[:2] == ("error", "TransportError"), reply
    assert "waiting for the sender's welcome" in reply[2]


def test_sender_without_receivers_times_out_naming_them() -> None:
    from rl_train.engines.weight_sync.backends import build_weight_sync_backend
    from rl_train.engines.weight_sync.config import WeightSyncConfig

    cfg = WeightSyncConfig(backend="bucketed", transport="tcp", num_receivers=2, timeout_seconds=0.5)
    sender = build_weight_sync_backend(cfg).build_sender()
    try:
        with pytest.raises(
            TransportError, match=r"timed out after 0.5 s waiting for receiver 1 of 2 to connect"
        ):
            run_sender(sender, lambda: iter(make_weights(0).items()), 1)
    finally:
        sender.close()


def test_export_failure_mid_stream_aborts_the_receiver_at_once(peer: Peer) -> None:
    weights = make_weights(0)
    pair = SyncPair(peer, "bucketed", "tcp", weights, timeout_seconds=10.0)

    def export():
        for number, item in enumerate(weights.items()):
            if number == 5:  # after the embedding went out in several buckets
                raise OSError("checkpoint shard unreadable")
            yield item

    try:
        peer.request("sync", pair.key, 1, None, 30.0)
        with pytest.raises(ExportError, match="checkpoint shard unreadable"):
            run_sender(pair.sender, export, 1)
        reply = peer.reply(5.0)
        assert reply[:2] == ("error", "TransportError"), reply
        assert "the sender aborted the sync" in reply[2] and "checkpoint shard unreadable" in reply[2]
        metrics, reply = pair.sync(weights, 2)  # both ends are back in step
        assert reply[0] == "ok" and reply[3] == 2, reply
    finally:
        pair.close()


@pytest.mark.parametrize(("backend", "transport"), bucketed_pairs())
def test_engine_failing_mid_load_reaches_the_sender_and_the_next_sync_works(
    peer: Peer, backend: str, transport: str
) -> None:
    weights = make_weights(0)
    pair = SyncPair(peer, backend, transport, weights, timeout_seconds=30.0)
    try:
        assert peer.call("fail_next", pair.key, 4) == ("ok",)
        peer.request("sync", pair.key, 1, None, 30.0)
        with pytest.raises(
            TransportError, match=r"receiver 0 aborted the sync: the receiving engine stopped"
        ):
            run_sender(pair.sender, lambda: iter(weights.items()), 1)
        reply = peer.reply(30.0)
        assert reply[:2] == ("error", "ReceiveError"), reply
        assert "boundary 'receive'" in reply[2] and "out of memory" in reply[2]
        updated = make_weights(1)
        _, reply = pair.sync(updated, 2)  # both ends are still in step
        assert reply[0] == "ok" and reply[3] == 2, reply
        assert_same_weights(reply[2], updated)
    finally:
        pair.close()


def test_version_mismatch_is_refused_at_receive_and_the_sender_hears_it(peer: Peer) -> None:
    weights = make_weights(0)
    pair = SyncPair(peer, "bucketed", "shm", weights, timeout_seconds=10.0)
    try:
        peer.request("sync", pair.key, 7, None, 10.0)  # the rollout side expects version 7
        with pytest.raises(TransportError, match="receiver 0 aborted"):
            run_sender(pair.sender, lambda: iter(weights.items()), 8)
        reply = peer.reply(30.0)
        assert reply[:2] == ("error", "ReceiveError"), reply
        assert "expected version 7, the sender sent 8" in reply[2]
    finally:
        pair.close()
