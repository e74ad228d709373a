"""Cutting a padded batch into micro-batches (R-4.2): by sample count or by a token budget."""

from __future__ import annotations

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
    micro_batches = []
    for lo, hi in bounds:
        width = int(max(lengths[lo:hi]))
        micro_batches.append({k: v[lo:hi, :width] if v.dim() >= 2 else v[lo:hi] for k, v in batch.items()})
    return micro_batches
