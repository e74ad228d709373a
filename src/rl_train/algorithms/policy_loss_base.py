"""What every policy loss takes and the helpers they share (no registry: see ``policy_loss``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.masked import masked_mean

__all__ = ["PolicyLossFn", "PolicyLossInputs", "log_ratio_of", "masked_mean", "with_is_weights"]


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
    teacher_log_probs: torch.Tensor | None = None
    """[B, T] the teacher's log-prob of each sampled token (distillation losses, R-4.10)."""
    teacher_topk_log_probs: torch.Tensor | None = None
    """[B, T, k] the teacher's log-probs of its k most likely tokens at each position."""
    student_topk_log_probs: torch.Tensor | None = None
    """[B, T, k] the current policy's log-probs (full softmax) at the teacher's top-k ids, with grad."""


PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def log_ratio_of(inputs: PolicyLossInputs) -> torch.Tensor:
    """[B, T] raw log(pi / pi_old); losses bound it only where they exponentiate (``bounded_exp``)."""
    return inputs.log_prob - inputs.old_log_prob


def with_is_weights(per_token: torch.Tensor, inputs: PolicyLossInputs) -> torch.Tensor:
    """Multiply by the rollout IS weights (detached again, defensively) when present."""
    if inputs.rollout_is_weights is None:
        return per_token
    return per_token * inputs.rollout_is_weights.detach()
