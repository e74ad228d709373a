"""The per-token KL estimators of the policy from a reference (the ``KL_ESTIMATORS`` table is in ``kl``).

Each takes log_ratio = log_prob - ref_log_prob, raw: only k3 exponentiates, and bounds it there.
"""

from __future__ import annotations

import torch

from rl_train.algorithms.log_ratio import bounded_exp

K3_BOUND = 10.0


def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """log_ratio (log pi - log pi_ref); unbiased, can be negative per token."""
    return log_ratio


def abs_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """|log_ratio|."""
    return log_ratio.abs()


def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """0.5 * log_ratio^2."""
    return 0.5 * log_ratio.square()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(-log_ratio) - 1 + log_ratio (Schulman's low-variance estimator), clamped to [-10, 10]."""
    return (bounded_exp(-log_ratio) - 1 + log_ratio).clamp(-K3_BOUND, K3_BOUND)
