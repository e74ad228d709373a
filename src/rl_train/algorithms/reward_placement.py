"""Scalar score -> token-level reward (R-6.4)."""

from __future__ import annotations

import torch


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores -> [B, T] with each score on its row's last mask==1 token, zeros elsewhere.

    A row with no graded token gets no reward at all (there is nothing to credit).
    """
    mask = response_mask > 0
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=scores.dtype)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores[rows]
    return out
