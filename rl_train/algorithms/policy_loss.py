"""Policy losses, registered by name in ``POLICY_LOSSES``.

Each loss is ``fn(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> (per_token_loss, metrics)``
with ``per_token_loss`` ``[B, T]`` (aggregated later by ``aggregation.aggregate_loss``) and
``metrics`` a dict of scalar tensors averaged over the response tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.registry import Registry

LOG_RATIO_BOUND = 20.0


@dataclass
class PolicyLossInputs:
    old_log_prob: torch.Tensor
    """[B, T] log-probs of the behaviour policy (pi_old) for the sampled tokens."""
    log_prob: torch.Tensor
    """[B, T] log-probs of the current policy, with grad."""
    advantages: torch.Tensor
    """[B, T] per-token advantages."""
    response_mask: torch.Tensor
    """[B, T] 1 on graded response tokens."""
    rollout_is_weights: torch.Tensor | None = None
    """[B, T] detached importance weights from rollout correction; multiplies the loss."""


PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


@POLICY_LOSSES.register("vanilla")
def compute_ppo_clip_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip (Ye et al. 2020).

    loss1 = -A * r, loss2 = -A * clip(r, 1 - eps_low, 1 + eps_high), clipped = max(loss1, loss2);
    for A < 0 the loss is further bounded by -A * c (c = clip_ratio_c) so that a tiny pi_old
    cannot make one token's ratio explode the update.
    """
    log_ratio = (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_bound = -adv * cfg.clip_ratio_c
    dual_loss = torch.minimum(clip_loss, dual_bound)
    per_token = torch.where(adv < 0, dual_loss, clip_loss)
    if inputs.rollout_is_weights is not None:
        per_token = per_token * inputs.rollout_is_weights
    mask = inputs.response_mask
    metrics = {
        "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask),
        "actor/pg_clipfrac_lower": masked_mean(((clip_loss > dual_bound) & (adv < 0)).float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return per_token, metrics
