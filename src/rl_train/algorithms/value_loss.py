"""Critic loss (clipped value loss, PPO) and the per-token entropy of the policy."""

from __future__ import annotations

import torch

from rl_train.algorithms.aggregation import aggregate_loss
from rl_train.algorithms.config import ValueLossConfig
from rl_train.algorithms.masked import masked_mean


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, all [B, T]: 0.5 * max((V - R)^2, (V_clip - R)^2).

    V_clip = clip(V, V_old - cliprange, V_old + cliprange): the critic cannot move a value by more
    than cliprange in one update, mirroring the policy's ratio clip. Clamping V itself (not
    V_old + clip(V - V_old)) returns V bit for bit inside the range, so critic/vf_clipfrac counts
    only real clipping, never a 1-ulp rounding difference.
    """
    clipped = values.clamp(old_values - cliprange, old_values + cliprange)
    loss_unclipped = (values - returns).square()
    loss_clipped = (clipped - returns).square()
    per_token = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    metrics = {"critic/vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask)}
    return per_token, metrics


def value_loss_terms(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: ValueLossConfig,
) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
    """(numerator, denominator, metrics) of the aggregated value loss, for the R-4.3 contract."""
    per_token, metrics = compute_value_loss(values, old_values, returns, response_mask, cfg.cliprange_value)
    numerator, denominator = aggregate_loss(
        per_token, response_mask, cfg.loss_agg_mode, cfg.loss_agg_norm_length
    )
    return numerator, denominator, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits -> [B, T] entropy H = logsumexp(z) - sum softmax(z) * z."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
