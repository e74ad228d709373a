"""The PPO clipped surrogate (with dual clip) and GPG's plain policy gradient."""

from __future__ import annotations

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, log_ratio_of, masked_mean, with_is_weights


def compute_ppo_clip_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip (Ye et al. 2020).

    loss1 = -A * r, loss2 = -A * clip(r, 1 - eps_low, 1 + eps_high), clipped = max(loss1, loss2);
    for A < 0 the loss is further bounded by -A * c (c = clip_ratio_c) so that a tiny pi_old
    cannot make one token's ratio explode the update.
    """
    log_ratio = log_ratio_of(inputs)
    ratio = bounded_exp(log_ratio)
    adv = inputs.advantages
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_bound = -adv * cfg.clip_ratio_c
    dual_loss = torch.minimum(clip_loss, dual_bound)
    per_token = torch.where(adv < 0, dual_loss, clip_loss)
    mask = inputs.response_mask
    metrics = {
        "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask),
        "actor/pg_clipfrac_lower": masked_mean(((clip_loss > dual_bound) & (adv < 0)).float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return with_is_weights(per_token, inputs), metrics


def compute_gpg_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG (Chu et al. 2025): plain policy gradient -A * log pi, no ratio and no clipping."""
    per_token = -inputs.advantages * inputs.log_prob
    return with_is_weights(per_token, inputs), {}
