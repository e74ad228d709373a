"""Rejection sampling (R-7.5): per-token divergences of the rollout engine from the training
engine, reduced per token or per sequence and compared with the parsed bounds of each RS option.

Statistics are computed from the raw log-ratio; only k3 exponentiates, through ``bounded_exp``.
The reference framework clamps each token's log-ratio to +-20 before all three estimators, so a
sum of k1 or k2 can differ from its value once a token passes +-20; such a token already lies far
outside any usable bound.
"""

from __future__ import annotations

import torch

from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean, masked_sum
from rl_train.algorithms.thresholds import Bounds, RejectionRule


def per_token_divergence(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """[B, T] per-token divergence of the rollout from the training engine.

    k1 = -log_ratio = log(pi_rollout / pi_old); k2 = 0.5 * log_ratio^2; k3 = exp(log_ratio) - 1 - log_ratio.
    """
    return _DIVERGENCES[estimator](log_ratio)


_DIVERGENCES = {
    "k1": lambda lr: -lr,
    "k2": lambda lr: 0.5 * lr.square(),
    "k3": lambda lr: bounded_exp(lr) - 1 - lr,
}


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True)


_LEVEL_STATISTICS = {
    "token": lambda v, m: v,
    "seq_sum": lambda v, m: masked_sum(v, m, dim=-1).unsqueeze(-1),
    "seq_mean": lambda v, m: masked_mean(v, m, dim=-1).unsqueeze(-1),
    "seq_max": _seq_max,
}


def inside_bounds(values: torch.Tensor, bounds: Bounds) -> torch.Tensor:
    """Elementwise lower <= values <= upper (closed; no lower bound when ``lower`` is None)."""
    above = values >= bounds.lower if bounds.lower is not None else torch.ones_like(values, dtype=torch.bool)
    return above & (values <= bounds.upper)


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, rules: list[RejectionRule]) -> torch.Tensor:
    """[B, T] bool: ``mask`` with the tokens / sequences that fail any rule removed.

    Every statistic is compared as it is: k1 ones (log pi_rollout / pi_old, summed or averaged)
    against the log-space bounds the parser made for them, k2 / k3 ones against theirs.
    """
    keep = mask.clone()
    for rule in rules:
        stat = _LEVEL_STATISTICS[rule.level](per_token_divergence(log_ratio, rule.estimator), mask)
        keep &= inside_bounds(stat, rule.bounds).expand_as(mask)
    return keep
