"""On a GPU machine: torch_dist moves buckets over NCCL, bit-exact (run by scripts/gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch
from weight_sync_helpers import assert_same_weights, make_weights
from weight_sync_pair import SyncPair

from rl_train.engines.weight_sync.transports import torch_dist

pytestmark = pytest.mark.gpu


def test_torch_dist_picks_cuda_and_nccl() -> None:
    assert torch.cuda.is_available()
    assert torch_dist._device().type == "cuda"
    assert torch.distributed.is_nccl_available()


@pytest.mark.parametrize("backend", ["bucketed", "delta"])
def test_nccl_round_trip_is_bit_exact(peer, backend: str) -> None:
    pair = SyncPair(peer, backend, "torch_dist", make_weights(0))
    try:
        for version, seed in ((1, 0), (2, 1)):
            weights = make_weights(seed)
            _, reply = pair.sync(weights, version)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
            assert reply[3] == version
    finally:
        pair.close()


def test_delta_with_the_snapshot_on_the_gpu_tracks_cuda_exports(peer) -> None:
    weights = make_weights(0)
    pair = SyncPair(peer, "delta", "shm", weights, delta_snapshot="device")
    try:
        for version, fraction in ((1, 0.0), (2, 0.01), (3, 0.03)):
            if fraction:
                weights = {
                    name: t + (torch.rand(t.shape) < fraction).to(t.dtype) if t.is_floating_point() else t
                    for name, t in weights.items()
                }
            cuda_weights = {name: t.cuda() for name, t in weights.items()}
            metrics, reply = pair.sync(cuda_weights, version)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
            assert metrics["weight_sync/full_resync"] == 0.0
        snapshots = pair.sender._snapshot.values()
        assert all(flat.is_cuda for _, flat in snapshots)
    finally:
        pair.close()
