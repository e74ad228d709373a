"""Ratio-shaped policy losses: GSPO, GMPO (geo_mean), SAPO and CISPO.

The sequence-level ratios (gspo, geo_mean) average the raw token log-ratios and bound only the
average, right before exp (see ``log_ratio``): a single token past +-20 must still move the mean.
"""

from __future__ import annotations

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, log_ratio_of, with_is_weights

Metrics = dict[str, torch.Tensor]
GSPO_LOG_RATIO_MAX = 10.0
"""gspo caps its token log-ratio above at 10 (as the reference does) instead of LOG_RATIO_BOUND: a
sequence ratio of e^10 is already far outside GSPO's 1e-4-wide clip range."""


def compute_gspo_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025): clip the sequence ratio s_i = exp(mean_t log r_it).

    Token form: log s_it = sg(log s_i) + log pi_t - sg(log pi_t), so every token carries the
    sequence ratio's value but its own gradient path. Clip range gspo_clip_ratio_{low,high};
    no dual clip. Use with loss_agg_mode seq-mean-token-mean to match the paper.
    """
    mask = inputs.response_mask
    log_ratio = log_ratio_of(inputs)
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)
    token_log_ratio = seq_log_ratio.detach() + inputs.log_prob - inputs.log_prob.detach()
    ratio = torch.exp(token_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    adv = inputs.advantages
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1 - cfg.gspo_clip_ratio_low, 1 + cfg.gspo_clip_ratio_high)
    per_token = torch.maximum(loss1, loss2)
    metrics = {
        "actor/pg_clipfrac": masked_mean((loss2 > loss1).float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return with_is_weights(per_token, inputs), metrics


def compute_geo_mean_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """GMPO (Zhao et al. 2025): maximise the geometric mean of token-clipped ratios.

    Per token, the log-ratio is clipped in log space to [-low, high] on the side that would
    increase the objective (the PPO min, written with sign(A)); the sequence ratio is
    exp(mean_t clipped log-ratio) and the sequence loss -mean_t(A) * ratio. That sequence loss is
    written on each of the sequence's tokens: with seq-mean-token-mean it is exactly the paper's
    sequence mean.
    """
    mask = inputs.response_mask
    log_ratio = log_ratio_of(inputs)
    sign = torch.sign(inputs.advantages)
    clamped = log_ratio.clamp(-cfg.geo_mean_clip_ratio_low, cfg.geo_mean_clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = bounded_exp(masked_mean(pessimistic, mask, dim=-1))
    seq_adv = masked_mean(inputs.advantages, mask, dim=-1)
    per_token = (-seq_adv * seq_ratio).unsqueeze(-1) * mask.to(log_ratio.dtype)
    metrics = {
        "actor/pg_clipfrac": masked_mean((clamped != log_ratio).float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return with_is_weights(per_token, inputs), metrics


def compute_sapo_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """SAPO (Gao et al. 2025): a soft sigmoid gate instead of the hard clip.

    loss = -A * (4 / tau) * sigmoid(tau * (r - 1)), tau = sapo_tau_pos if A > 0 else sapo_tau_neg.
    The gradient weight 4 * s * (1 - s) is 1 at r = 1 (same as vanilla on-policy) and decays
    smoothly as r leaves 1; negative advantages decay faster (tau_neg > tau_pos).
    """
    log_ratio = log_ratio_of(inputs)
    ratio = bounded_exp(log_ratio)
    adv = inputs.advantages
    tau = torch.where(adv > 0, torch.full_like(adv, cfg.sapo_tau_pos), torch.full_like(adv, cfg.sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    per_token = -adv * gate
    metrics = {"actor/ppo_kl": masked_mean(-log_ratio, inputs.response_mask).detach()}
    return with_is_weights(per_token, inputs), metrics


def compute_cispo_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, 2025): -sg(clip(r, 1 - low, 1 + high)) * A * log pi.

    The clipped ratio is a detached weight, so clipped tokens still get a gradient (only its
    scale is bounded), unlike PPO where they get none.
    """
    ratio = bounded_exp(log_ratio_of(inputs))
    weight = ratio.clamp(1 - cfg.cispo_clip_ratio_low, 1 + cfg.cispo_clip_ratio_high).detach()
    per_token = -inputs.advantages * weight * inputs.log_prob
    metrics = {"actor/pg_clipfrac": masked_mean((weight != ratio.detach()).float(), inputs.response_mask)}
    return with_is_weights(per_token, inputs), metrics
