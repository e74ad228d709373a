"""Covariance-based entropy-preserving losses (Cui et al. 2025): clip_cov and kl_cov.

Both score each response token by the centred covariance
cov_t = (A_t - mean A) * (log pi_t - mean log pi) (means over the micro-batch's response tokens)
and treat a small fraction of high-covariance tokens specially, because those tokens drive the
entropy collapse. The statistics are per call, i.e. per micro-batch, as in the paper.
"""

from __future__ import annotations

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, log_ratio_of, with_is_weights

Metrics = dict[str, torch.Tensor]


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] detached centred covariance of advantage and log-prob; -inf outside the mask."""
    adv, logp = advantages.detach(), log_prob.detach()
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
    return cov.masked_fill(~mask.bool(), float("-inf"))


def _num_selected(fraction: float, mask: torch.Tensor) -> int:
    return max(1, int(fraction * float(mask.sum())))


def compute_clip_cov_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO clip, plus detach the gradient of a random clip_cov_ratio fraction of tokens
    whose covariance lies in (clip_cov_lb, clip_cov_ub) and that the ratio clip left alone.

    The random pick uses torch's global generator (seeded by the trainer).
    """
    mask = inputs.response_mask.bool()
    ratio = bounded_exp(log_ratio_of(inputs))
    adv = inputs.advantages
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clipped_by_ratio = (loss2 > loss1) & mask
    cov = token_covariance(adv, inputs.log_prob, mask)
    candidates = mask & ~clipped_by_ratio & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    positions = candidates.nonzero()
    picked = positions[torch.randperm(len(positions))[: _num_selected(cfg.clip_cov_ratio, mask)]]
    keep = torch.ones_like(adv)
    keep[picked[:, 0], picked[:, 1]] = 0.0
    per_token = torch.maximum(loss1, loss2) * keep
    metrics = {
        "actor/pg_clipfrac": masked_mean(clipped_by_ratio.float(), mask),
        "actor/cov_detached_frac": masked_mean(1 - keep, mask),
    }
    return with_is_weights(per_token, inputs), metrics


def compute_kl_cov_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: unclipped -A * r everywhere; the top kl_cov_ratio fraction of tokens by covariance
    additionally pays kl_cov_coef * |log pi - log pi_old|.
    """
    mask = inputs.response_mask.bool()
    log_ratio = log_ratio_of(inputs)
    per_token = -inputs.advantages * bounded_exp(log_ratio)
    cov = token_covariance(inputs.advantages, inputs.log_prob, mask).flatten()
    k = min(_num_selected(cfg.kl_cov_ratio, mask), int(mask.sum()))
    selected = torch.zeros_like(cov, dtype=torch.bool)
    selected[torch.topk(cov, k).indices] = True
    selected = selected.view_as(per_token) & mask
    per_token = per_token + selected.to(per_token.dtype) * cfg.kl_cov_coef * log_ratio.abs()
    metrics = {
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "actor/cov_penalized_frac": masked_mean(selected.float(), mask),
    }
    return with_is_weights(per_token, inputs), metrics
