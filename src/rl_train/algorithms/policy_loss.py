"""Policy losses, by name: the ``POLICY_LOSSES`` table of every built-in loss.

Each loss is ``fn(inputs: PolicyLossInputs, cfg: PolicyLossConfig) -> (per_token_loss, metrics)``
with ``per_token_loss`` ``[B, T]`` (aggregated later by ``aggregation.aggregate_loss``) and
``metrics`` a dict of scalar tensors averaged over the response tokens. Every loss multiplies its
per-token loss by the (detached) rollout IS weights when they are given. The losses live in
``policy_loss_clip`` (PPO clip, GPG), ``policy_loss_ratio`` (ratio-based variants),
``policy_loss_cov`` (covariance-based) and ``policy_loss_dppo`` (divergence trust regions);
their inputs and shared helpers in ``policy_loss_base``. None imports this module back.
"""

from __future__ import annotations

from rl_train.algorithms.policy_loss_base import (
    PolicyLossFn,
    PolicyLossInputs,
    log_ratio_of,
    masked_mean,
    with_is_weights,
)
from rl_train.algorithms.policy_loss_clip import compute_gpg_loss, compute_ppo_clip_loss
from rl_train.algorithms.policy_loss_cov import compute_clip_cov_loss, compute_kl_cov_loss
from rl_train.algorithms.policy_loss_dppo import compute_dppo_kl_loss, compute_dppo_tv_loss
from rl_train.algorithms.policy_loss_ratio import (
    compute_cispo_loss,
    compute_geo_mean_loss,
    compute_gspo_loss,
    compute_sapo_loss,
)
from rl_train.registry import Registry

__all__ = ["POLICY_LOSSES", "PolicyLossFn", "PolicyLossInputs", "log_ratio_of", "masked_mean", "with_is_weights"]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry.from_table(
    "policy loss",
    {
        "vanilla": compute_ppo_clip_loss,
        "gpg": compute_gpg_loss,
        "gspo": compute_gspo_loss,
        "geo_mean": compute_geo_mean_loss,
        "sapo": compute_sapo_loss,
        "cispo": compute_cispo_loss,
        "clip_cov": compute_clip_cov_loss,
        "kl_cov": compute_kl_cov_loss,
        "dppo_tv": compute_dppo_tv_loss,
        "dppo_kl": compute_dppo_kl_loss,
    },
)
