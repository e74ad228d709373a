"""What a teacher writes on a trajectory, and which of it a distillation loss reads (R-4.10).

The teacher pool scores every response token of a finished trajectory and writes, on its record:
- ``teacher_log_probs``: [L] the teacher's log-prob of each sampled token;
- ``teacher_topk_ids`` and ``teacher_topk_log_probs``: [L][k] its k most likely next tokens at
  each position and their log-probs (only when the loss reads them: ``teacher.top_k``).

The trainer collates them to ``[B, T]`` and ``[B, T, k]`` tensors on the response positions;
the training engine then adds the student's own log-probs at those ids
(``STUDENT_TOPK_LOG_PROBS``) to its outputs. This module imports nothing: the config and the
driver's step plan read it without torch.
"""

from __future__ import annotations

TEACHER_LOG_PROBS = "teacher_log_probs"
TEACHER_TOPK_IDS = "teacher_topk_ids"
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"
STUDENT_TOPK_LOG_PROBS = "student_topk_log_probs"
"""The model output: the student's log-probs (full softmax, at the run's temperature) gathered at
``teacher_topk_ids``, ``[B, T, k]``; the loss renormalises them over the k."""

TOPK_FIELDS = (TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS)
DISTILL_TERMS = ("reverse_kl", "forward_kl_topk")
"""What ``distillation_ppo`` adds to the PPO loss (``actor.distill_term``)."""


def teacher_fields(policy_loss: str, distill_term: str = "reverse_kl") -> tuple[str, ...]:
    """The record fields ``policy_loss`` reads of a teacher (none: the run needs no teacher)."""
    term = distill_term if policy_loss == "distillation_ppo" else policy_loss
    if term == "reverse_kl":
        return (TEACHER_LOG_PROBS,)
    if term == "forward_kl_topk":
        return TOPK_FIELDS
    return ()
