"""Bucket layout, delta flushes and config checks, in one process, against hand-computed values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from rl_train.engines.weight_sync.buckets import ChunkMeta, TensorAssembler, pack_buckets
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.delta_codec import decode_flushes, encode_flushes, verify_flushes
from rl_train.engines.weight_sync.delta_diff import (
    SCAN_ELEMENTS,
    SnapshotDiffer,
    diff_on_device,
    split_ranges,
)


def test_bucket_layout_keeps_small_tensors_whole_and_chunks_big_ones() -> None:
    # 16-byte buckets. a = 3 x fp32 = 12 bytes at [0, 12) of bucket 0. b = 4 x int16 = 8 bytes
    # would fit a bucket but not the 4 bytes left, so it starts bucket 1 whole at [0, 8). The
    # next start aligns to 64 bytes, past the end, so c = 10 x int32 = 40 bytes, bigger than a
    # bucket, is cut 16 + 16 + 8 over buckets 2, 3 and 4 (buffers alternate 0, 1, 0, 1, 0).
    a = torch.tensor([1.0, -0.0, float("nan")])
    b = torch.tensor([1, -2, 3, -4], dtype=torch.int16)
    c = torch.arange(10, dtype=torch.int32)
    buffers = [torch.zeros(16, dtype=torch.uint8) for _ in range(2)]
    emitted: list[tuple[int, int, list[ChunkMeta]]] = []
    assembler, rebuilt = TensorAssembler(), {}

    def emit(index: int, nbytes: int, chunks: list[ChunkMeta]) -> None:
        emitted.append((index, nbytes, chunks))
        for name, tensor in assembler.add_bucket(buffers[index][:nbytes], chunks):
            rebuilt[name] = tensor.clone()  # lent until the next item

    assert pack_buckets([("a", a), ("b", b), ("c", c)], buffers, lambda index: None, emit) == 5
    assert [(index, nbytes) for index, nbytes, _ in emitted] == [(0, 12), (1, 8), (0, 16), (1, 16), (0, 8)]
    assert [chunk for _, _, chunks in emitted for chunk in chunks] == [
        ChunkMeta("a", "torch.float32", (3,), 12, 0, 0, 12),
        ChunkMeta("b", "torch.int16", (4,), 8, 0, 0, 8),
        ChunkMeta("c", "torch.int32", (10,), 40, 0, 0, 16),
        ChunkMeta("c", "torch.int32", (10,), 40, 16, 0, 16),
        ChunkMeta("c", "torch.int32", (10,), 40, 32, 0, 8),
    ]
    assert torch.equal(rebuilt["a"].view(torch.int32), a.view(torch.int32))  # NaN and -0.0 bits kept
    assert torch.equal(rebuilt["b"], b)
    assert torch.equal(rebuilt["c"], c)


def test_flushes_are_cut_by_entry_count_whatever_the_dtype() -> None:
    # 7 fp32 changes then 4 int8 changes, 5 entries per flush: flushes of 5, 5 and 1 entries.
    changes = [
        ("w", torch.arange(7, dtype=torch.int32), torch.ones(7)),
        ("q", torch.arange(4, dtype=torch.int32), torch.ones(4, dtype=torch.int8)),
    ]
    flushes = decode_flushes(encode_flushes(changes, entries_per_flush=5))
    assert [flush.num_entries for flush in flushes] == [5, 5, 1]
    assert [[name for name, _, _ in flush.segments] for flush in flushes] == [["w"], ["w", "q"], ["q"]]
    layout = {"w": (torch.float32, 7), "q": (torch.int8, 4)}
    assert verify_flushes(flushes, layout) is None
    assert (
        verify_flushes(flushes, layout | {"q": (torch.int8, 3)}) == "flush 2 has positions outside tensor 'q'"
    )
    assert verify_flushes(flushes, layout | {"w": (torch.bfloat16, 7)}) == (
        "flush 0 does not match tensor 'w' of the last full sync"
    )
    flushes[1].segments[1][2][0] = 9  # one value changed after its checksum was taken
    assert verify_flushes(flushes, layout) == "checksum mismatch in flush 1"


def test_diff_compares_bits_and_updates_the_snapshot() -> None:
    snapshot = torch.tensor([0.0, 1.0, float("nan"), 2.0])
    current = torch.tensor([-0.0, 1.0, float("nan"), 3.0])
    index, values = SnapshotDiffer().diff(current, snapshot)
    assert index.dtype == torch.int32
    assert index.tolist() == [0, 3]  # -0.0 differs from 0.0 in its bits; NaN equals itself bitwise
    assert values.tolist() == [-0.0, 3.0]
    assert torch.equal(snapshot.view(torch.int32), current.view(torch.int32))


@pytest.mark.parametrize(
    "snapshot",
    [
        torch.tensor([0.0, 1.0, float("nan"), 2.0, 5.0]),
        torch.tensor([True, False, True]),
        torch.tensor([2**40, -3, 7], dtype=torch.int64),
        torch.randn(3, 1000).to(torch.bfloat16),
    ],
    ids=["fp32", "bool", "int64", "bf16"],
)
def test_torch_diff_for_device_snapshots_matches_the_host_scan(snapshot: torch.Tensor) -> None:
    # Run on the CPU here; on a GPU the same torch ops run where the snapshot lives.
    current = snapshot.clone()
    flat = current.view(-1)
    flat[0] = -flat[0] if flat.is_floating_point() else ~flat[0]
    flat[-1] = flat[0]
    host_snapshot = snapshot.reshape(-1).clone()
    device_snapshot = snapshot.reshape(-1).clone()
    expected_index, expected_values = SnapshotDiffer().diff(current, host_snapshot)
    index, values = diff_on_device(current, device_snapshot)
    assert index.dtype == torch.int32 and index.tolist() == expected_index.tolist()
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(device_snapshot.view(torch.uint8), host_snapshot.view(torch.uint8))


def test_split_ranges_cut_at_scan_steps_and_cover_everything() -> None:
    step = SCAN_ELEMENTS
    assert split_ranges(10, 4) == [(0, 10)]  # one scan step: nothing to share
    assert split_ranges(3 * step + 5, 2) == [(0, 2 * step), (2 * step, 3 * step + 5)]
    assert split_ranges(4 * step, 3) == [(0, step), (step, 2 * step), (2 * step, 4 * step)]
    assert split_ranges(0, 2) == []


@pytest.mark.parametrize("threads", [1, 3])
def test_threaded_diff_finds_every_change_in_order(threads: int) -> None:
    # bf16 over 2.5 scan steps, so three threads get a range each and the last is short.
    generator = torch.Generator().manual_seed(0)
    snapshot = torch.randn(int(2.5 * SCAN_ELEMENTS), generator=generator).to(torch.bfloat16)
    current = snapshot.clone()
    expected = torch.randperm(snapshot.numel(), generator=generator)[:5000].sort().values
    current[expected] += 1.0
    current[-1] = -current[-1]  # the very last element, in the short range
    expected = torch.cat([expected[expected != snapshot.numel() - 1], torch.tensor([snapshot.numel() - 1])])
    differ = SnapshotDiffer(threads)
    try:
        index, values = differ.diff(current, snapshot)
        assert torch.equal(index.long(), expected)
        assert torch.equal(values.view(torch.int16), current[expected].view(torch.int16))
        assert torch.equal(snapshot.view(torch.int16), current.view(torch.int16))
        again, _ = differ.diff(current, snapshot)
        assert again.numel() == 0  # the snapshot now holds what was sent
        empty, nothing = differ.diff(torch.empty(0, 4), torch.empty(0))
        assert empty.numel() == nothing.numel() == 0
    finally:
        differ.close()


def test_unavailable_transport_fails_at_config_time_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as if the wheel were not installed
    with pytest.raises(ValidationError, match=r"transport.*mooncake-transfer-engine-non-cuda.*libibverbs1"):
        WeightSyncConfig(backend="bucketed", transport="mooncake")
    WeightSyncConfig(backend="naive", transport="mooncake")  # naive moves nothing over a transport


def test_unknown_backend_lists_the_registered_ones() -> None:
    with pytest.raises(ValidationError, match=r"available: bucketed, delta, naive"):
        WeightSyncConfig(backend="rdma-magic")


def test_heavy_transports_are_imported_only_when_chosen() -> None:
    # A clean interpreter: building the default backends must not load Mooncake or c10d groups.
    code = (
        "import sys\n"
        "from rl_train.engines.weight_sync import WeightSyncConfig, build_weight_sync_backend\n"
        "sender = build_weight_sync_backend(WeightSyncConfig(backend='bucketed', transport='tcp')).build_sender()\n"
        "sender.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('mooncake') or m.endswith('transports.torch_dist')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
