"""One sender, several rollout replicas receiving the same sync at the same time."""

from __future__ import annotations

import uuid

import pytest
from weight_sync_helpers import BUCKET_SIZE_BYTES, assert_same_weights, bucketed_pairs, make_weights
from weight_sync_peers import Peer, pack_tensors, unpack_tensors

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.boundaries import run_sender
from rl_train.engines.weight_sync.config import WeightSyncConfig


@pytest.mark.parametrize(("backend", "transport"), bucketed_pairs())
def test_every_replica_receives_every_sync_bit_exact(peer: Peer, backend: str, transport: str) -> None:
    cfg = WeightSyncConfig(
        backend=backend,
        transport=transport,
        num_receivers=2,
        bucket_size_bytes=BUCKET_SIZE_BYTES,
        timeout_seconds=20.0,
    )
    sender = build_weight_sync_backend(cfg).build_sender()
    keys = [uuid.uuid4().hex for _ in range(2)]
    for key in keys:
        sparse_engine = key == keys[1]  # delta: one replica takes sparse updates, one whole tensors
        assert peer.call(
            "open", key, cfg.model_dump(), sender.descriptor(), pack_tensors(make_weights(0)), sparse_engine
        ) == ("ok",)
    try:
        for version, seed in ((1, 0), (2, 1)):
            weights = make_weights(seed)
            peer.request("sync_many", ",".join(keys), version, 20.0)
            try:
                run_sender(sender, lambda weights=weights: iter(weights.items()), version)
            finally:
                reply = peer.reply(30.0)
            assert reply[0] == "ok", reply
            for packed in reply[1]:
                assert_same_weights(unpack_tensors(packed), weights)
    finally:
        sender.close()
