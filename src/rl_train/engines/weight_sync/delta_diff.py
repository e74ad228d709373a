"""The sender's half of ``delta``: which entries changed since the snapshot, found bit by bit.

A scan compares integer views of the export and the snapshot one cache-sized step at a
time, so the per-element mask never leaves the cache: the cost is the two reads of every
byte. The changed values are picked and written into the snapshot while that step is
still in cache. Large tensors are split over ``threads`` contiguous ranges, the calling
thread scanning the first; numpy drops the GIL in every call of the scan. A snapshot kept
on the GPU beside the exported tensor (``delta_snapshot: device``) is diffed there instead.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np
import torch

SCAN_ELEMENTS = 1 << 20
"""Elements compared per step: a 1 MiB mask, cache-resident on any server CPU."""

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Found = tuple[list[np.ndarray], list[np.ndarray]]


def _scan(now: np.ndarray, before: np.ndarray, start: int, stop: int) -> Found:
    """Positions in [start, stop) where ``now`` differs from ``before``, their values; updates ``before``."""
    mask = np.empty(min(SCAN_ELEMENTS, stop - start), dtype=bool)
    positions: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for low in range(start, stop, SCAN_ELEMENTS):
        high = min(low + SCAN_ELEMENTS, stop)
        current, previous, hits = now[low:high], before[low:high], mask[: high - low]
        np.not_equal(current, previous, out=hits)
        where = np.flatnonzero(hits)
        if where.size:
            changed = current[where]
            previous[where] = changed
            positions.append(where + low)
            values.append(changed)
    return positions, values


def split_ranges(num_elements: int, parts: int) -> list[tuple[int, int]]:
    """At most ``parts`` contiguous ranges covering [0, num_elements), cut at scan-step boundaries."""
    steps = -(-num_elements // SCAN_ELEMENTS)
    parts = max(1, min(parts, steps))
    cuts = [min(num_elements, (steps * part // parts) * SCAN_ELEMENTS) for part in range(parts + 1)]
    return [(low, high) for low, high in pairwise(cuts) if high > low]


def diff_on_device(current: torch.Tensor, snapshot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same diff in torch ops where ``snapshot`` lives (on a GPU: at memory speed, and only
    the changed entries come back to the host). Returns host tensors; updates ``snapshot``."""
    flat = current.detach().reshape(-1).to(snapshot.device)
    bits = _INT_OF_SIZE[flat.element_size()]
    now, before = flat.view(bits), snapshot.view(bits)
    index = torch.nonzero(now != before).squeeze(1)
    values = now[index]
    before[index] = values
    index = index.to(torch.int32) if now.numel() < 2**31 else index
    return index.cpu(), values.view(flat.dtype).cpu()


class SnapshotDiffer:
    """Diffs exports against snapshots on ``threads`` threads (the caller's included)."""

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._pool = (
            ThreadPoolExecutor(threads - 1, thread_name_prefix="weight-sync-diff") if threads > 1 else None
        )

    def diff(self, current: torch.Tensor, snapshot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat positions where ``current`` differs bitwise from ``snapshot`` (flat), and the new values.

        Compares bit patterns, so -0.0 vs 0.0 and NaN payloads count as changes and the
        receiver ends bit-identical. ``snapshot`` is updated in place to ``current``.
        Positions are int32 when the tensor allows it, to keep the payload small.
        """
        if snapshot.device.type != "cpu":
            return diff_on_device(current, snapshot)
        flat = current.detach().reshape(-1).to(snapshot.device)
        bits = _INT_OF_SIZE[flat.element_size()]
        now, before = flat.view(bits).numpy(), snapshot.view(bits).numpy()
        ranges = split_ranges(now.size, self._threads)
        if self._pool is None or len(ranges) < 2:
            found = [_scan(now, before, 0, now.size)]
        else:
            futures = [self._pool.submit(_scan, now, before, low, high) for low, high in ranges[1:]]
            found = [_scan(now, before, *ranges[0]), *(future.result() for future in futures)]
        positions = [part for part_positions, _ in found for part in part_positions]
        values = [part for _, part_values in found for part in part_values]
        index = np.concatenate(positions) if positions else np.empty(0, dtype=np.int64)
        changed = np.concatenate(values) if values else np.empty(0, dtype=now.dtype)
        index = index.astype(np.int32) if now.size < 2**31 else index
        return torch.from_numpy(index), torch.from_numpy(changed).view(flat.dtype)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
