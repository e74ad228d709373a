"""Rollout correction, bypass_mode and the in-reward KL wired through real Ray actors (2 steps each)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rl_train.config import Config
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

OFF_POLICY_METRICS = ("kl", "k3_kl", "ppl_ratio", "log_ppl_diff", "chi2_token", "chi2_seq")


@pytest.mark.parametrize(
    "algorithm",
    [
        # IS weights reach the actor loss, RS edits the mask, the ref phase runs for the reward KL.
        {
            "rollout_correction": {"preset": "token_is_k3_rs"},
            "kl_in_reward": True,
            "kl_ctrl": {"type": "adaptive", "kl_coef": 0.01},
        },
        # old_log_probs copied from the rollout: the divergences are exactly zero.
        {"rollout_correction": {"preset": "bypass", "rollout_is": "token"}},
    ],
    ids=["token_is_k3_rs+kl_in_reward", "bypass"],
)
def test_rollout_correction_metrics_every_step(
    small_run_config: dict[str, Any], ray_local, algorithm: dict[str, Any]
) -> None:
    from rl_train.flows.train import run_training

    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(use_prefect=False, total_steps=2, val_every_steps=0)
    cfg["algorithm"] = algorithm
    summary = run_training(Config.model_validate(cfg))
    metrics = read_metrics(summary["run_dir"])
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for name in (*OFF_POLICY_METRICS, "rollout_is_mean", "rollout_is_eff_sample_size"):
            assert f"rollout_corr/{name}" in m, name
        assert 0.0 < m["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-9
        assert 0.0 <= m["rollout_corr/rollout_rs_masked_fraction"] <= 1.0
        assert "actor/loss" in m
    if algorithm.get("kl_in_reward"):
        assert all(m["timing/ref"] > 0 and "actor/reward_kl_penalty_coeff" in m for m in metrics)
    else:
        assert all(m["rollout_corr/kl"] == 0.0 and m["rollout_corr/rollout_is_mean"] == 1.0 for m in metrics)
        assert "timing/ref" not in metrics[0]
