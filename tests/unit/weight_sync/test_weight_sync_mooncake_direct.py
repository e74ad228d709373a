"""Mooncake's zero-copy path: big chunks written from the exported tensors, the rest packed."""

from __future__ import annotations

import pytest
import torch
from weight_sync_helpers import assert_same_weights, make_weights, unavailable_marks
from weight_sync_pair import SyncPair

pytestmark = unavailable_marks("mooncake")


def test_big_chunks_go_direct_and_arrive_bit_exact(peer, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_train.engines.weight_sync.transports import mooncake

    monkeypatch.setattr(mooncake, "DIRECT_MIN_BYTES", 4096)  # the 64 KiB test buckets hold direct chunks
    weights = make_weights(0)
    weights["model.lm_head.weight"] = weights["model.embed_tokens.weight"]  # a tied alias: one storage
    weights["model.transposed.weight"] = torch.randn(64, 96).t()  # not contiguous: packed from a copy
    pair = SyncPair(peer, "bucketed", "mooncake", weights)
    transport = pair.sender._stream._transport
    transport.direct_allowed = True  # rollout.weight_sync.mooncake.direct: true
    offered: list[tuple[int, int]] = []
    place_direct = transport.place_direct

    def spy(index: int, offset: int, data: torch.Tensor) -> bool:
        taken = place_direct(index, offset, data)
        offered.append((data.numel(), taken))
        return taken

    monkeypatch.setattr(transport, "place_direct", spy)
    try:
        for version, seed in ((1, 0), (2, 1)):
            if seed:
                weights = {name: t + 1 if t.is_floating_point() else t for name, t in weights.items()}
            _, reply = pair.sync(weights, version)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
        assert any(taken for _, taken in offered), "no chunk went direct"
        assert all(taken for size, taken in offered if size >= 4096)
        assert not any(taken for size, taken in offered if size < 4096)
        assert transport._registered == {}  # every direct registration was dropped after its write
        assert transport._direct == [[], []]
    finally:
        pair.close()


def test_segments_cover_the_bucket_around_direct_chunks() -> None:
    from rl_train.engines.weight_sync.transports import mooncake

    sender = mooncake.Sender.__new__(mooncake.Sender)  # layout only: no engine needed
    sender.buffers = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(2)]
    data = torch.zeros(300 << 10, dtype=torch.uint8)
    sender._direct = [[(4096, data.numel(), data)], []]
    staged = sender.buffers[0].data_ptr()
    end = 4096 + data.numel()
    assert sender.segments(0, end + 100) == [
        (staged, 0, 4096),
        (data.data_ptr(), 4096, data.numel()),
        (staged + end, end, 100),
    ]
    assert sender.segments(1, 10) == [(sender.buffers[1].data_ptr(), 0, 10)]
    assert sender.segments(1, 0) == []


def test_direct_writes_are_off_unless_the_config_asks(peer) -> None:
    """By default no exported tensor is registered with Mooncake: a peer reaching the engine
    could otherwise write the trainer's live parameters while a bucket is pushed."""
    from rl_train.engines.weight_sync.config import MooncakeConfig

    weights = make_weights(0)
    pair = SyncPair(peer, "bucketed", "mooncake", weights)
    transport = pair.sender._stream._transport
    try:
        assert MooncakeConfig().direct is False and transport.direct_allowed is False
        big = torch.zeros(1 << 20, dtype=torch.uint8)
        assert transport.place_direct(0, 0, big) is False
        assert transport._registered == {}
        _, reply = pair.sync(weights, 1)
        assert reply[0] == "ok", reply
        assert_same_weights(reply[2], weights)
    finally:
        pair.close()
