"""One suite, every backend/transport pair this machine can run, across two real processes."""

from __future__ import annotations

import logging

import pytest
import torch
from weight_sync_faults import CorruptingDeltaSender
from weight_sync_helpers import assert_same_weights, make_weights, runnable_pairs
from weight_sync_pair import SyncPair

TIMING = [f"timing/weight_sync/{name}" for name in ("quiesce", "receive", "recover")]


def sparse_update(weights: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A training step's worth of change: about ``fraction`` of the float entries move, a few ints."""
    generator = torch.Generator().manual_seed(seed)
    updated = {}
    for name, tensor in weights.items():
        new = tensor.clone()
        if tensor.is_floating_point() and tensor.numel():
            mask = torch.rand(tensor.shape, generator=generator) < fraction
            step = torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
            new[mask] += step[mask]
        elif tensor.dtype == torch.int64 and tensor.numel():
            new[int(torch.randint(tensor.numel(), (1,), generator=generator))] += 1
        updated[name] = new
    return updated


@pytest.mark.parametrize(("backend", "transport"), runnable_pairs())
def test_round_trip_is_bit_exact_and_carries_versions(peer, backend: str, transport: str) -> None:
    pair = SyncPair(peer, backend, transport, make_weights(0))
    try:
        for version, seed in ((3, 0), (4, 1)):
            weights = make_weights(seed)
            metrics, reply = pair.sync(weights, version)
            assert reply[0] == "ok", reply
            _, receiver_metrics, received, served_version, events = reply
            assert_same_weights(received, weights)
            assert served_version == version
            # The prefix cache is reset after the new weights land and before KV resumes.
            assert events[-3:] == [f"update_weights:{version}", "reset_prefix_cache", "resume_kv_cache"]
            assert set(TIMING) <= receiver_metrics.keys()
            assert {"timing/weight_sync/export", "timing/weight_sync/transport"} <= metrics.keys()
            assert metrics["weight_sync/bytes"] >= sum(t.numel() * t.element_size() for t in weights.values())
    finally:
        pair.close()


@pytest.mark.parametrize(("backend", "transport"), runnable_pairs())
def test_sparse_updates_end_equal_to_a_full_sync(peer, backend: str, transport: str) -> None:
    weights = make_weights(0)
    full_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    pair = SyncPair(peer, backend, transport, weights, delta_entries_per_flush=500)
    try:
        pair.sync(weights, 0)
        for step in range(1, 5):
            weights = sparse_update(weights, fraction=0.01, seed=step)
            metrics, reply = pair.sync(weights, step)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
            if backend == "delta":
                # ~1% of entries at index+value (<= 8+4 bytes per 4-byte entry) is far below the full size.
                assert metrics["weight_sync/bytes"] < full_bytes / 5
                assert metrics["weight_sync/full_resync"] == 0.0
    finally:
        pair.close()


DELTA_PAIRS = [p for p in runnable_pairs() if p.values[0] == "delta"]


@pytest.mark.parametrize(("backend", "transport"), DELTA_PAIRS)
def test_delta_writes_only_the_changed_entries_into_a_sparse_engine(
    peer, backend: str, transport: str
) -> None:
    weights = make_weights(0)
    pair = SyncPair(peer, backend, transport, weights, sparse_engine=True, delta_threads=3)
    try:
        _, reply = pair.sync(weights, 0)
        assert reply[4][-3] == "update_weights:0"  # the seed is whole tensors
        for step in range(1, 4):
            weights = sparse_update(weights, fraction=0.01, seed=step)
            metrics, reply = pair.sync(weights, step)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
            assert reply[3] == step
            assert reply[4][-3:] == [f"update_weights_sparse:{step}", "reset_prefix_cache", "resume_kv_cache"]
            assert metrics["weight_sync/full_resync"] == 0.0
    finally:
        pair.close()


CORRUPTION_CASES = [
    *(pytest.param(*p.values, False, id=f"{p.id}-whole", marks=p.marks) for p in DELTA_PAIRS),
    pytest.param("delta", "shm", True, id="delta-shm-sparse"),
]


@pytest.mark.parametrize(("backend", "transport", "sparse_engine"), CORRUPTION_CASES)
def test_corrupted_delta_is_rejected_and_recovered_by_full_resync(
    peer, backend: str, transport: str, sparse_engine: bool, caplog: pytest.LogCaptureFixture
) -> None:
    weights = make_weights(0)
    pair = SyncPair(
        peer, backend, transport, weights, sender_class=CorruptingDeltaSender, sparse_engine=sparse_engine
    )
    try:
        pair.sync(weights, 0)  # the seed is a full stream: nothing to corrupt
        updated = sparse_update(weights, fraction=0.02, seed=7)
        with caplog.at_level(logging.ERROR):
            metrics, reply = pair.sync(updated, 1)
        assert reply[0] == "ok", reply
        assert metrics["weight_sync/full_resync"] == 1.0
        assert "rejected" in caplog.text and "checksum mismatch" in caplog.text
        assert_same_weights(reply[2], updated)
        assert reply[3] == 1
    finally:
        pair.close()
