"""Policy losses, registered by name in ``POLICY_LOSSES``.

Each loss is ``fn(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> (per_token_loss, metrics)``
with ``per_token_loss`` ``[B, T]`` (aggregated later by ``aggregation.aggregate_loss``) and
``metrics`` a dict of scalar tensors averaged over the response tokens. Every loss multiplies its
per-token loss by the (detached) rollout IS weights when they are given. Importing this module
registers all losses: ratio-based variants live in ``policy_loss_ratio``, covariance-based ones
in ``policy_loss_cov``, divergence trust regions in ``policy_loss_dppo``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean
from rl_train.registry import Registry

__all__ = ["POLICY_LOSSES", "PolicyLossInputs", "masked_mean", "log_ratio_of", "with_is_weights"]


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


def log_ratio_of(inputs: PolicyLossInputs) -> torch.Tensor:
    """[B, T] raw log(pi / pi_old); losses bound it only where they exponentiate (``bounded_exp``)."""
    return inputs.log_prob - inputs.old_log_prob


def with_is_weights(per_token: torch.Tensor, inputs: PolicyLossInputs) -> torch.Tensor:
    """Multiply by the rollout IS weights (detached again, defensively) when present."""
    if inputs.rollout_is_weights is None:
        return per_token
    return per_token * inputs.rollout_is_weights.detach()


@POLICY_LOSSES.register("vanilla")
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


@POLICY_LOSSES.register("gpg")
def compute_gpg_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG (Chu et al. 2025): plain policy gradient -A * log pi, no ratio and no clipping."""
    per_token = -inputs.advantages * inputs.log_prob
    return with_is_weights(per_token, inputs), {}


# Registration side effect: every loss module registers into POLICY_LOSSES on import.
from rl_train.algorithms import policy_loss_cov, policy_loss_dppo, policy_loss_ratio  # noqa: E402, F401
