"""KL estimators between the policy and a reference, per token, in the ``KL_ESTIMATORS`` table.

With log_ratio = log_prob - ref_log_prob (raw: only k3 exponentiates, and bounds it there):
k1 = log_ratio; abs = |log_ratio|; k2 = mse = 0.5 * log_ratio^2;
k3 (low_var_kl, Schulman's unbiased low-variance estimator) = exp(-log_ratio) - 1 + log_ratio,
clamped to [-10, 10] because a single outlier token otherwise dominates the batch.
The estimators live in ``kl_estimators``; the table names them by import path, so the config
checks ``actor.kl_penalty`` and ``algorithm.kl_penalty`` without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    import torch

KlFn = Callable[["torch.Tensor"], "torch.Tensor"]

_HOME = "rl_train.algorithms.kl_estimators:"

KL_ESTIMATORS: Registry[Entry[KlFn]] = Registry(
    "KL estimator",
    "actor.kl_penalty, algorithm.kl_penalty",
    {
        "k1": Entry(_HOME + "k1"),
        "abs": Entry(_HOME + "abs_kl"),
        "k2": Entry(_HOME + "k2"),
        "mse": Entry(_HOME + "k2", "alias of k2."),
        "k3": Entry(_HOME + "k3"),
        "low_var_kl": Entry(_HOME + "k3", "alias of k3."),
    },
)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of the policy from the reference (``kind``: a registered name)."""
    return KL_ESTIMATORS.get(kind)(log_prob - ref_log_prob)
