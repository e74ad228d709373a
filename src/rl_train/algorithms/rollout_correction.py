"""Rollout correction (R-7.1, R-7.4, R-7.5): IS weights and rejection sampling against the
log-probs the rollout engine reported for the tokens it sampled.

log_ratio = old_log_prob - rollout_log_prob (training engine's pi_old over the rollout
engine's pi_rollout). Sums and means use it raw; it is bounded only right before exp
(``log_ratio.bounded_exp``), so the sequence IS weight is exp(clamp(sum_t log_ratio)).

- RS (``rollout_rs``, ``rejection``) removes tokens (token_*) or whole sequences (seq_*) from the
  response mask; several options are ANDed. The returned mask then drives advantage, loss and
  metrics.
- IS (``rollout_is``) returns detached weights that multiply the policy loss only: per token
  exp(log_ratio), or per sequence exp(sum_t log_ratio) broadcast to the sequence. A single
  threshold u truncates above u (TIS); "lo_hi" zeroes weights outside [lo, hi] (IcePop). Optional
  batch normalisation rescales the kept weights to mean 1 (over tokens, or over sequences).
  IS runs after RS, over the mask RS kept (the reference framework uses the input mask): R-7.5
  makes the RS mask the response mask of everything downstream, so a rejected token must not
  enter a sequence's IS weight (or the batch normalisation) any more than its loss.
- bypass_mode uses the rollout log-probs as old_log_prob (see ``bypass_old_log_prob``); IS and RS
  then become identities and the metrics trivial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_train.algorithms.config import RolloutCorrectionConfig
from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean, masked_sum
from rl_train.algorithms.rejection import inside_bounds, rejection_mask
from rl_train.algorithms.rollout_metrics import off_policy_metrics, weight_statistics
from rl_train.algorithms.thresholds import Bounds, RejectionRule, parse_is_threshold, parse_rs_rules


class MissingRolloutLogProbsError(ValueError):
    """Rollout correction or bypass_mode was configured but the batch has no rollout log-probs."""


def bypass_old_log_prob(rollout_log_prob: torch.Tensor | None) -> torch.Tensor:
    """bypass_mode (R-7.1): old_log_prob := rollout_log_prob, which must exist."""
    if rollout_log_prob is None:
        raise MissingRolloutLogProbsError(
            "algorithm.rollout_correction.bypass_mode=true needs rollout_log_probs in the batch, but the "
            "rollout engine returned none; make the engine return the sampled tokens' log-probs or set "
            "bypass_mode=false so old_log_prob is recomputed by the training engine"
        )
    return rollout_log_prob.detach().clone()


def importance_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str, bounds: Bounds, batch_normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] detached weights, zero outside ``mask``; the weight of each IS unit, for metrics)."""
    if level == "token":
        unit_weights = bounded_exp(log_ratio)
        unit_mask = mask
    else:  # sequence: one weight per sequence with at least one kept token
        unit_weights = bounded_exp(masked_sum(log_ratio, mask, dim=-1)).unsqueeze(-1)
        unit_mask = mask.any(dim=-1, keepdim=True)
    if bounds.lower is None:
        unit_weights = unit_weights.clamp(max=bounds.upper)
    else:
        unit_weights = unit_weights * inside_bounds(unit_weights, bounds).to(unit_weights.dtype)
    if batch_normalize:
        unit_weights = unit_weights / masked_mean(unit_weights, unit_mask).clamp(min=1e-8)
    weights = unit_weights.expand_as(log_ratio) * mask.to(log_ratio.dtype)
    return weights.detach(), unit_weights[unit_mask.expand_as(unit_weights)].detach()


@dataclass(frozen=True)
class RolloutCorrectionPlan:
    """The parsed config: built once, so the per-step path parses no strings."""

    is_level: str | None
    is_bounds: Bounds
    is_batch_normalize: bool
    rs_rules: list[RejectionRule]

    @classmethod
    def from_config(cls, cfg: RolloutCorrectionConfig) -> RolloutCorrectionPlan:
        rules = parse_rs_rules(cfg.rollout_rs, cfg.rollout_rs_threshold) if cfg.rollout_rs else []
        return cls(
            cfg.rollout_is,
            parse_is_threshold(cfg.rollout_is_threshold),
            cfg.rollout_is_batch_normalize,
            rules,
        )


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
    cfg: RolloutCorrectionConfig | RolloutCorrectionPlan,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """All [B, T]: -> (IS weights or None, response mask after RS, ``rollout_corr/*`` metrics)."""
    plan = cfg if isinstance(cfg, RolloutCorrectionPlan) else RolloutCorrectionPlan.from_config(cfg)
    if rollout_log_prob is None:
        if plan.is_level is not None or plan.rs_rules:
            raise MissingRolloutLogProbsError(
                "algorithm.rollout_correction enables IS/RS but the batch has no rollout_log_probs; the "
                "rollout engine must return the sampled tokens' log-probs"
            )
        return None, response_mask, {}
    mask = response_mask.bool()
    log_ratio = old_log_prob.detach() - rollout_log_prob.detach()
    new_mask = rejection_mask(log_ratio, mask, plan.rs_rules) if plan.rs_rules else mask
    metrics = off_policy_metrics(old_log_prob.detach(), rollout_log_prob.detach(), mask)
    weights = None
    if plan.is_level is not None:
        weights, unit_weights = importance_weights(
            log_ratio, new_mask, plan.is_level, plan.is_bounds, plan.is_batch_normalize
        )
    else:  # diagnostics only: what token-level IS would see
        unit_weights = bounded_exp(log_ratio[mask])
    metrics.update(weight_statistics(unit_weights))
    metrics["rollout_corr/rollout_rs_masked_fraction"] = float(1 - new_mask.sum() / mask.sum().clamp(min=1))
    return weights, new_mask.to(response_mask.dtype), metrics
