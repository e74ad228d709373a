"""Cutting a padded batch into micro-batches (R-4.2): by sample count or by a token budget,
in the batch's order or with rows of like length together."""

from __future__ import annotations

import math

import torch

Batch = dict[str, torch.Tensor]


def split_micro_batches(
    batch: Batch, micro_batch_size: int | None, max_tokens_per_micro_batch: int | None
) -> list[Batch]:
    """Consecutive row ranges of ``batch``; each is trimmed to its own longest sequence (every
    field of two or more dimensions is [rows, positions, ...]).

    With a token budget, rows are added while (rows x longest row) stays within the budget,
    which is what a padded forward actually costs; a single over-long row still forms its own
    micro-batch. With neither limit set, the batch is one micro-batch.
    """
    lengths = batch["attention_mask"].sum(dim=-1).tolist()
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < len(lengths):
        end = start + 1
        longest = lengths[start]
        while end < len(lengths):
            if micro_batch_size is not None and end - start >= micro_batch_size:
                break
            candidate = max(longest, lengths[end])
            if (
                max_tokens_per_micro_batch is not None
                and candidate * (end - start + 1) > max_tokens_per_micro_batch
            ):
                break
            longest = candidate
            end += 1
        bounds.append((start, end))
        start = end
    return cut_rows(batch, bounds, lengths)


def cut_rows(batch: Batch, bounds: list[tuple[int, int]], lengths: list[int]) -> list[Batch]:
    """The row ranges ``bounds`` of ``batch``, each trimmed to its longest row's ``lengths``."""
    micro_batches = []
    for lo, hi in bounds:
        width = int(max(lengths[lo:hi]))
        micro_batches.append({k: v[lo:hi, :width] if v.dim() >= 2 else v[lo:hi] for k, v in batch.items()})
    return micro_batches


def length_sorted_micro_batches(
    batch: Batch, micro_batch_size: int | None, max_tokens_per_micro_batch: int | None
) -> tuple[list[Batch], torch.Tensor]:
    """Micro-batches of the batch's rows ordered by length (shortest first), and that order:
    row ``i`` of the micro-batches laid end to end is row ``order[i]`` of ``batch``.

    Rows of like length then share a micro-batch, so each is trimmed to about its own length.
    The cuts are where the padding they remove outweighs a micro-batch's fixed cost, within
    ``micro_batch_size`` rows (``padding_cuts``): a multi-turn batch of rows of 129-131 tokens
    with a few of 169 is cut in two, a batch of rows of one length is cut only by the count.
    Under a token budget the sorted rows are cut as ``split_micro_batches`` cuts them.
    """
    lengths = batch["attention_mask"].sum(dim=-1)
    order = torch.sort(lengths, stable=True).indices
    ordered = {key: value[order] for key, value in batch.items()}
    if max_tokens_per_micro_batch is not None:
        return split_micro_batches(ordered, micro_batch_size, max_tokens_per_micro_batch), order
    sorted_lengths = [int(length) for length in lengths[order].tolist()]
    return cut_rows(ordered, padding_cuts(sorted_lengths, micro_batch_size), sorted_lengths), order


MAX_CUT_CANDIDATES = 256
"""The most places a cut may fall (the programme is quadratic in them, in Python): a batch with
more distinct lengths, or more rows under a row cap, is cut only at evenly spaced ones."""


def padding_cuts(
    sorted_lengths: list[int], max_rows: int | None = None, overhead_tokens: int | None = None
) -> list[tuple[int, int]]:
    """Row ranges of ascending ``sorted_lengths``, each of at most ``max_rows`` rows, that
    minimise the padded tokens of all the ranges plus ``overhead_tokens`` per range.

    The default overhead is 1/32 of the real tokens, at least 64: a cut has to save about 3%
    of the batch's work (each micro-batch is one more forward, with its fixed cost). A dynamic
    programme: over the runs of equal length when no range is capped (a cut inside a run
    never pays then), over the rows within ``max_rows`` otherwise;
    past ``MAX_CUT_CANDIDATES`` places to cut, over evenly spaced ones (near the best, not it).
    """
    rows = len(sorted_lengths)
    if not rows:
        return []
    if overhead_tokens is None:
        overhead_tokens = max(64, sum(sorted_lengths) // 32)
    cap = max_rows or rows
    if cap >= rows:
        ends = [i + 1 for i in range(rows) if i + 1 == rows or sorted_lengths[i + 1] != sorted_lengths[i]]
    else:
        ends = list(range(1, rows + 1))
    if len(ends) > MAX_CUT_CANDIDATES and rows <= cap * MAX_CUT_CANDIDATES:
        # thin the places a cut may fall to evenly spaced ones, each range still within the cap
        stride = len(ends) / MAX_CUT_CANDIDATES
        ends = sorted({ends[min(round((k + 1) * stride), len(ends)) - 1] for k in range(MAX_CUT_CANDIDATES)})
        if any(b - a > cap for a, b in zip([0, *ends[:-1]], ends, strict=True)):
            ends = list(range(1, rows + 1))
    starts = [0, *ends[:-1]]  # candidate range starts, each with its index in ends
    best = [0.0] + [math.inf] * len(ends)  # best[j]: the cheapest cover of rows [0, ends[j - 1])
    cut_before = [0] * (len(ends) + 1)
    for j in range(1, len(ends) + 1):
        end, width = ends[j - 1], sorted_lengths[ends[j - 1] - 1]
        for i in range(j - 1, -1, -1):  # the last range is rows [starts[i], end)
            if end - starts[i] > cap:
                break
            candidate = best[i] + (end - starts[i]) * width + overhead_tokens
            if candidate < best[j]:
                best[j], cut_before[j] = candidate, i
    ranges: list[tuple[int, int]] = []
    j = len(ends)
    while j:
        i = cut_before[j]
        ranges.append((starts[i], ends[j - 1]))
        j = i
    return ranges[::-1]
