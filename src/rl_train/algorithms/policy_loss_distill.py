"""Distillation losses in the policy-loss slot (R-4.10): the student learns from a teacher's
per-token scores of the student's own samples.

- ``reverse_kl``: on-policy distillation. The advantage of token t is
  ``teacher_log_prob_t - old_log_prob_t``, minus the reverse KL's per-token estimate on the
  sampled token, detached; it drives the same PPO clipped surrogate (dual clip included) as
  ``vanilla``, so the student moves towards where the teacher puts more mass than it does, within
  the trust region. The task's advantages are ignored.
- ``forward_kl_topk``: per token, ``sum_k p_k (log p_k - log q_k)`` over the teacher's top-k
  ids, both sides renormalised over those k (the teacher's top-k mass rarely sums to 1, and the
  student's log-probs at those ids are of its full softmax). The gradient reaches the student
  only.
- ``distillation_ppo``: ``vanilla`` on the task's advantages plus ``distill_coef`` times the term
  ``distill_term`` names (one of the two above, per token).

Each returns the per-token loss ``[B, T]``: aggregation (and so the global denominator and every
``loss_agg_mode``) happens in ``actor_loss``, as for every other loss.
"""

from __future__ import annotations

import dataclasses

import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.policy_loss_base import PolicyLossInputs, masked_mean, with_is_weights
from rl_train.algorithms.policy_loss_clip import compute_ppo_clip_loss
from rl_train.algorithms.teacher_fields import (
    STUDENT_TOPK_LOG_PROBS,
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_LOG_PROBS,
)

Metrics = dict[str, torch.Tensor]


def _field(inputs: PolicyLossInputs, name: str, loss: str) -> torch.Tensor:
    """``inputs.<name>``, or a clear error: no distillation loss trains on a missing score."""
    value = getattr(inputs, name)
    if value is None:
        source = (
            "the training engine computes it from teacher_topk_ids"
            if name == STUDENT_TOPK_LOG_PROBS
            else "the teacher phase must write it on every trajectory"
        )
        raise ValueError(f"policy loss {loss!r} reads {name}, which this micro-batch lacks ({source})")
    return value


def reverse_kl_term(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig, loss: str = "reverse_kl"
) -> tuple[torch.Tensor, Metrics]:
    """The PPO clip on the distillation advantage ``teacher_log_prob - old_log_prob`` (detached)."""
    teacher = _field(inputs, TEACHER_LOG_PROBS, loss)
    gap = (teacher - inputs.old_log_prob).detach()
    per_token, metrics = compute_ppo_clip_loss(dataclasses.replace(inputs, advantages=gap), cfg)
    metrics["distill/reverse_kl"] = masked_mean(-gap, inputs.response_mask)
    return per_token, metrics


def forward_kl_topk_term(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig, loss: str = "forward_kl_topk"
) -> tuple[torch.Tensor, Metrics]:
    """KL(p || q) over the teacher's top-k, each renormalised over the k; IS weights multiply it."""
    teacher = _field(inputs, TEACHER_TOPK_LOG_PROBS, loss).detach()
    student = _field(inputs, STUDENT_TOPK_LOG_PROBS, loss)
    log_p = torch.log_softmax(teacher.to(student.dtype), dim=-1)
    log_q = torch.log_softmax(student, dim=-1)
    p = log_p.exp()
    # a zero-mass teacher entry (log-prob -inf) adds nothing, where 0 * -inf would give NaN
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    # positions off the response hold padding; keep them finite so the masked sum stays exact
    kl = torch.where(inputs.response_mask.bool(), terms.sum(dim=-1), torch.zeros_like(inputs.old_log_prob))
    metrics = {"distill/forward_kl_topk": masked_mean(kl.detach(), inputs.response_mask)}
    return with_is_weights(kl, inputs), metrics


def compute_reverse_kl_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> tuple[torch.Tensor, Metrics]:
    """On-policy distillation: PPO clip with A_t = teacher_log_prob_t - old_log_prob_t (the task's
    advantages are ignored)."""
    return reverse_kl_term(inputs, cfg)


def compute_forward_kl_topk_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, Metrics]:
    """Forward KL from the teacher's top-k to the student, both renormalised over those k ids."""
    return forward_kl_topk_term(inputs, cfg)


DISTILL_TERM_FNS = {"reverse_kl": reverse_kl_term, "forward_kl_topk": forward_kl_topk_term}
"""``actor.distill_term`` -> the per-token term ``distillation_ppo`` adds (its names are
``teacher_fields.DISTILL_TERMS``)."""


def compute_distillation_ppo_loss(
    inputs: PolicyLossInputs, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, Metrics]:
    """PPO clip on the task's advantages plus ``distill_coef`` x the ``distill_term`` per token.

    The term's own PPO statistics (reverse_kl) are reported under ``distill/`` beside the task's."""
    ppo, metrics = compute_ppo_clip_loss(inputs, cfg)
    term, term_metrics = DISTILL_TERM_FNS[cfg.distill_term](inputs, cfg, "distillation_ppo")
    for key, value in term_metrics.items():
        metrics[key.replace("actor/", "distill/", 1)] = value
    return ppo + cfg.distill_coef * term, metrics
