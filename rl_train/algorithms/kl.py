"""KL estimators between the policy and a reference, per token.

With log_ratio = log_prob - ref_log_prob (clamped to +-20 so exp cannot overflow):
k1 = log_ratio; abs = |log_ratio|; k2 = mse = 0.5 * log_ratio^2;
k3 (low_var_kl, Schulman's unbiased low-variance estimator) = exp(-log_ratio) - 1 + log_ratio,
clamped to [-10, 10] because a single outlier token otherwise dominates the batch.
"""

from __future__ import annotations

import torch

LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of the policy from the reference."""
    log_ratio = (log_prob - ref_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("k2", "mse"):
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        return (torch.exp(-log_ratio) - 1 + log_ratio).clamp(-K3_BOUND, K3_BOUND)
    raise ValueError(f"unknown KL estimator {kind!r}; available: abs, k1, k2, k3, low_var_kl, mse")
