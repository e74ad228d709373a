"""The actor's loss function: the registered policy loss plus optional entropy and KL terms.

The training engine does not know the algorithm: it calls
``loss_fn(model_output, micro_batch) -> (loss_sum, denominator, metrics)`` (R-4.3) and
divides the summed numerators by the global denominator once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_train.algorithms.aggregation import aggregate_loss
from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.kl import kl_penalty
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, masked_mean
from rl_train.algorithms.teacher_fields import (
    STUDENT_TOPK_LOG_PROBS,
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_LOG_PROBS,
)

Batch = dict[str, torch.Tensor]
LossFn = Callable[[Batch, Batch], tuple[torch.Tensor, float, dict[str, float]]]


def build_actor_loss_fn(cfg: PolicyLossConfig) -> LossFn:
    """Resolve the registered names once; the returned function never looks at a string."""
    policy_loss = POLICY_LOSSES.get(cfg.policy_loss)
    reads_advantages = POLICY_LOSSES[cfg.policy_loss].reads_advantages

    def actor_loss(model_output: Batch, micro_batch: Batch) -> tuple[torch.Tensor, float, dict[str, float]]:
        mask = micro_batch["response_mask"]
        log_prob = model_output["log_probs"]
        per_token, metrics = policy_loss(
            PolicyLossInputs(
                old_log_prob=micro_batch["old_log_probs"],
                log_prob=log_prob,
                # a distillation-only loss ignores the task's advantages: a run may have none
                advantages=micro_batch["advantages"] if reads_advantages else torch.zeros_like(mask),
                response_mask=mask,
                rollout_is_weights=micro_batch.get("rollout_is_weights"),
                teacher_log_probs=micro_batch.get(TEACHER_LOG_PROBS),
                teacher_topk_log_probs=micro_batch.get(TEACHER_TOPK_LOG_PROBS),
                student_topk_log_probs=model_output.get(STUDENT_TOPK_LOG_PROBS),
            ),
            cfg,
        )
        out = {k: float(v) for k, v in metrics.items()}
        out["actor/pg_loss"] = float(masked_mean(per_token.detach(), mask))
        if cfg.entropy_coeff > 0:
            entropy = model_output["entropy"]
            per_token = per_token - cfg.entropy_coeff * entropy
            out["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
        if cfg.kl_loss:
            kl = kl_penalty(log_prob, micro_batch["ref_log_probs"], cfg.kl_penalty)
            per_token = per_token + cfg.kl_loss_coef * kl
            out["actor/kl"] = float(masked_mean(kl.detach(), mask))
        numerator, denominator = aggregate_loss(per_token, mask, cfg.loss_agg_mode, cfg.loss_agg_norm_length)
        return numerator, denominator, out

    return actor_loss
