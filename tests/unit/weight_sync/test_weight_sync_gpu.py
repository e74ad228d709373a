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
