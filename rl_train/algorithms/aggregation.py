"""Loss aggregation: per-token losses -> (numerator, denominator) with a global denominator.

The training engine sums numerators and denominators over every micro-batch and every DP
rank and divides once (R-4.3), so the result does not depend on how a batch is split.
``token-sum`` returns a zero denominator; the engine clamps the global one to >= 1.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: float | None = None
) -> tuple[torch.Tensor, float]:
    """Return (numerator, denominator) of the mode's mean; see the module docstring."""
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    tokens_per_seq = mask.sum(dim=-1)
    num_seqs = float((tokens_per_seq > 0).sum())
    if mode == "token-mean":
        return masked.sum(), float(mask.sum())
    if mode == "token-sum":
        return masked.sum(), 0.0
    if mode == "seq-mean-token-sum":
        return masked.sum(), num_seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / tokens_per_seq.clamp(min=1)).sum(), num_seqs
    if mode == "seq-mean-token-sum-norm":
        length = norm_length if norm_length is not None else per_token_loss.shape[-1]
        return masked.sum() / length, num_seqs
    raise ValueError(f"unknown loss_agg_mode {mode!r}; available: {', '.join(LOSS_AGG_MODES)}")
