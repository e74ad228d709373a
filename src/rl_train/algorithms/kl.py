"""KL estimators between the policy and a reference, per token, in the ``KL_ESTIMATORS`` table.

With log_ratio = log_prob - ref_log_prob (raw: only k3 exponentiates, and bounds it there):
k1 = log_ratio; abs = |log_ratio|; k2 = mse = 0.5 * log_ratio^2;
k3 (low_var_kl, Schulman's unbiased low-variance estimator) = exp(-log_ratio) - 1 + log_ratio,
clamped to [-10, 10] because a single outlier token otherwise dominates the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.registry import Registry

K3_BOUND = 10.0

KlFn = Callable[[torch.Tensor], torch.Tensor]
def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _abs(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    return (bounded_exp(-log_ratio) - 1 + log_ratio).clamp(-K3_BOUND, K3_BOUND)


KL_ESTIMATORS: Registry[KlFn] = Registry.from_table(
    "KL estimator", {"k1": _k1, "abs": _abs, "k2": _k2, "mse": _k2, "k3": _k3, "low_var_kl": _k3}
)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of the policy from the reference."""
    try:
        estimator = KL_ESTIMATORS.get(kind)
    except KeyError as err:
        raise ValueError(str(err)) from None
    return estimator(log_prob - ref_log_prob)
