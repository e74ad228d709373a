"""Policy losses, by name: the ``POLICY_LOSSES`` table of every built-in loss.

Each loss is ``fn(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> (per_token_loss, metrics)``
with ``per_token_loss`` ``[B, T]`` (aggregated later by ``aggregation.aggregate_loss``) and
``metrics`` a dict of scalar tensors averaged over the response tokens. Every loss multiplies its
per-token loss by the (detached) rollout IS weights when they are given. The losses live in
``policy_loss_clip`` (PPO clip, GPG), ``policy_loss_ratio`` (ratio-based variants),
``policy_loss_cov`` (covariance-based), ``policy_loss_dppo`` (divergence trust regions) and
``policy_loss_distill`` (a teacher's scores, R-4.10: which record fields each reads is
``teacher_fields.teacher_fields``);
their inputs and shared helpers in ``policy_loss_base``. The table names each by import path,
so the config checks a name without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.algorithms.policy_loss_base import PolicyLossFn  # noqa: F401 (the quoted base class below)


@dataclass(frozen=True)
class PolicyLoss(Entry["PolicyLossFn"]):
    """A policy loss (its description: the function's docstring)."""

    per_micro_batch: bool = False
    """Its statistics are taken per micro-batch: which rows share one changes what it trains
    (``actor.sort_by_length`` is refused beside it)."""
    reads_advantages: bool = True
    """It reads the task's advantages (the distillation-only losses do not: the update then
    takes them when the records have them and never asks for them)."""


_CLIP = "rl_train.algorithms.policy_loss_clip:"
_RATIO = "rl_train.algorithms.policy_loss_ratio:"
_COV = "rl_train.algorithms.policy_loss_cov:"
_DPPO = "rl_train.algorithms.policy_loss_dppo:"
_DISTILL = "rl_train.algorithms.policy_loss_distill:"

POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss",
    "actor.policy_loss",
    {
        "vanilla": PolicyLoss(_CLIP + "compute_ppo_clip_loss"),
        "gpg": PolicyLoss(_CLIP + "compute_gpg_loss"),
        "gspo": PolicyLoss(_RATIO + "compute_gspo_loss"),
        "geo_mean": PolicyLoss(_RATIO + "compute_geo_mean_loss"),
        "sapo": PolicyLoss(_RATIO + "compute_sapo_loss"),
        "cispo": PolicyLoss(_RATIO + "compute_cispo_loss"),
        "clip_cov": PolicyLoss(_COV + "compute_clip_cov_loss", per_micro_batch=True),
        "kl_cov": PolicyLoss(_COV + "compute_kl_cov_loss", per_micro_batch=True),
        "dppo_tv": PolicyLoss(_DPPO + "compute_dppo_tv_loss"),
        "dppo_kl": PolicyLoss(_DPPO + "compute_dppo_kl_loss"),
        "reverse_kl": PolicyLoss(_DISTILL + "compute_reverse_kl_loss", reads_advantages=False),
        "forward_kl_topk": PolicyLoss(_DISTILL + "compute_forward_kl_topk_loss", reads_advantages=False),
        "distillation_ppo": PolicyLoss(_DISTILL + "compute_distillation_ppo_loss"),
    },
)
