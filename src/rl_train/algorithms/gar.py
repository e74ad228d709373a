"""Groupwise advantage redistribution (GAR, R-6.6), a pure function on one prompt group.

Steps, for one group of n trajectories:
1. Confirmed reward hackers get effective reward 0 and count as failing; the group statistics
   (GRPO mean / unbiased std) are recomputed on the effective rewards.
2. Let P be the set of passing trajectories with positive advantage. Each is down-weighted by
   its quality f_i in (0, 1], and the positive mass removed is handed back through one common
   factor c applied to all of P: A'_i = c * f_i * A_i with c = sum_P A_i / sum_P f_i A_i.
   Hence sum_P A'_i = sum_P A_i: the group's total positive advantage is unchanged, and among
   passers the high-quality ones (f = 1) gain at the expense of the low-quality ones.
3. Every other trajectory (failing, or with a non-positive advantage) keeps its advantage.
"""

from __future__ import annotations

import torch

EPSILON = 1e-6


def redistribute_group_advantages(
    rewards: torch.Tensor,
    passed: torch.Tensor,
    quality: torch.Tensor,
    hacked: torch.Tensor,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """All [n] (one group): rewards, passed (bool), quality f in (0, 1], hacked (bool) -> advantages [n]."""
    if bool(((quality <= 0) | (quality > 1)).any()):
        raise ValueError("GAR quality factors must lie in (0, 1]")
    hacked = hacked.bool()
    effective = torch.where(hacked, torch.zeros_like(rewards), rewards)
    advantages = _group_advantages(effective, norm_by_std)
    receivers = passed.bool() & ~hacked & (advantages > 0)
    weighted = quality.to(advantages.dtype) * advantages
    weighted_mass = weighted[receivers].sum()
    if weighted_mass <= 0:
        return advantages
    scale = advantages[receivers].sum() / weighted_mass
    return torch.where(receivers, scale * weighted, advantages)


def _group_advantages(rewards: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    return centred / (rewards.std(unbiased=True) + EPSILON) if norm_by_std else centred
