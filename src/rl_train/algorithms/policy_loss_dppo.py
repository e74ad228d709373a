"""DPPO (Qi et al. 2026, "Rethinking the Trust Region in LLM RL"): divergence trust regions.

PPO's ratio clip over-constrains low-probability tokens and under-constrains high-probability
ones. DPPO instead bounds a divergence between pi_old and pi, here with the paper's cheap
"binary" approximation on the sampled token y (the two-outcome distribution {y, not y}):
- TV: |pi(y) - pi_old(y)|;
- KL: p log(p / q) + (1 - p) log((1 - p) / (1 - q)), p = pi_old(y), q = pi(y).
A token's gradient is masked (loss = 0) only when it is outside the region *and* the update
moves it further away in the advantage's direction (A > 0 and pi(y) > pi_old(y), or A < 0 and
pi(y) < pi_old(y)); otherwise the loss is -A * min(r, c) with c = clip_ratio_c.

The truncation at c matters for rare tokens: pi_old(y) = 0.001 -> pi(y) = 0.01 is a ratio of 10
but a TV step of only 0.009, well inside the region. The truncated ratio is a detached weight on
pi / sg(pi), so such a token gets the gradient -A * c * grad log pi, never more than a token at
r = c, while tokens below c keep exactly the gradient of -A * r.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, log_ratio_of, with_is_weights

Metrics = dict[str, torch.Tensor]
PROB_EPS = 1e-6
"""Keeps the binary KL finite when a probability reaches 0 or 1."""


def binary_tv(p_old: torch.Tensor, p_new: torch.Tensor) -> torch.Tensor:
    return (p_new - p_old).abs()


def binary_kl(p_old: torch.Tensor, p_new: torch.Tensor) -> torch.Tensor:
    p = p_old.clamp(PROB_EPS, 1 - PROB_EPS)
    q = p_new.clamp(PROB_EPS, 1 - PROB_EPS)
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def _dppo_loss(
    inputs: PolicyLossInputs,
    divergence: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    threshold: float,
    truncation: float,
) -> tuple[torch.Tensor, Metrics]:
    mask = inputs.response_mask
    log_ratio = log_ratio_of(inputs)
    adv = inputs.advantages
    p_old = torch.exp(inputs.old_log_prob.detach())
    p_new = torch.exp(inputs.log_prob.detach())
    outside = divergence(p_old, p_new) > threshold
    moving_away = ((adv > 0) & (p_new > p_old)) | ((adv < 0) & (p_new < p_old))
    blocked = outside & moving_away
    ratio = bounded_exp(log_ratio).detach()
    # value min(r, c), gradient min(r, c) * grad log pi (for r < c: exactly those of r)
    truncated = ratio.clamp(max=truncation) * torch.exp(inputs.log_prob - inputs.log_prob.detach())
    per_token = -adv * truncated * (~blocked).to(adv.dtype)
    metrics = {
        "actor/pg_clipfrac": masked_mean(blocked.float(), mask),
        "actor/pg_clipfrac_lower": masked_mean(((ratio > truncation) & ~blocked).float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return with_is_weights(per_token, inputs), metrics


def compute_dppo_tv_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """DPPO with the binary total-variation region (radius dppo_tv_threshold), ratio truncated at c."""
    return _dppo_loss(inputs, binary_tv, cfg.dppo_tv_threshold, cfg.clip_ratio_c)


def compute_dppo_kl_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """DPPO with the binary KL region (radius dppo_kl_threshold), ratio truncated at c."""
    return _dppo_loss(inputs, binary_kl, cfg.dppo_kl_threshold, cfg.clip_ratio_c)
