"""The algorithm config surface: names and thresholds are validated at load, with clear messages."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rl_train.algorithms.config import AlgorithmConfig, PolicyLossConfig, RolloutCorrectionConfig


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"adv_estimator": "grpoo"}, "available: gae, gpg, grpo"),
        ({"kl_penalty": "k4"}, "k1"),
        ({"kl_ctrl": {"type": "pid"}}, "fixed"),
        ({"rollout_correction": {"rollout_is": "tokens"}}, "token"),
        ({"rollout_correction": {"rollout_is_threshold": "abc"}}, '"lower_upper" pair'),
        ({"rollout_correction": {"rollout_is_threshold": "2_1"}}, "lower < upper"),
        ({"rollout_correction": {"rollout_is_threshold": -1}}, "must be > 0"),
        (
            {"rollout_correction": {"rollout_rs": "token_k4", "rollout_rs_threshold": 2}},
            "rollout_rs\n.*unknown rejection-sampling option 'token_k4'; available: seq_max_k2, seq_max_k3",
        ),
        (
            {"rollout_correction": {"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2}},
            "unknown rejection-sampling option 'seq_max_k1'",
        ),
        ({"rollout_correction": {"rollout_rs": " , "}}, "empty option list"),
        ({"rollout_correction": {"rollout_rs": "token_k1"}}, "rollout_rs_threshold is required"),
        ({"rollout_correction": {"rollout_rs": "token_k1", "rollout_rs_threshold": 0.9}}, "needs u > 1"),
        (
            {"rollout_correction": {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "2,3,4"}},
            "one per",
        ),
        ({"rollout_correction": {"preset": "nope"}}, "unknown rollout-correction preset 'nope'; available: bypass, k3_rs"),
        ({"rollout_correction": {"rollout_iss": "token"}}, "Extra inputs"),
    ],
)
def test_algorithm_config_errors(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AlgorithmConfig(**fields)


def test_preset_fills_fields_and_explicit_fields_win() -> None:
    cfg = RolloutCorrectionConfig(preset="token_is_k3_rs", rollout_is_threshold=3)
    assert (cfg.rollout_is, cfg.rollout_is_threshold, cfg.rollout_rs) == ("token", "3", "seq_mean_k3")
    assert RolloutCorrectionConfig(preset="bypass").bypass_mode is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"policy_loss": "ppo"}, "available: cispo, clip_cov"),
        ({"loss_agg_mode": "mean"}, "token-mean"),
        ({"loss_agg_mode": "seq-mean-token-sum-norm"}, "loss_agg_norm_length"),
        ({"clip_ratio_c": 1.0}, "greater than 1"),
        ({"clip_ratio_low": 1.0}, "less than 1"),
    ],
)
def test_policy_loss_config_errors(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PolicyLossConfig(**fields)


def test_every_field_has_a_docstring() -> None:
    from rl_train.algorithms.config import KLControlConfig, ValueLossConfig

    for model in (
        AlgorithmConfig,
        PolicyLossConfig,
        RolloutCorrectionConfig,
        KLControlConfig,
        ValueLossConfig,
    ):
        missing = [name for name, field in model.model_fields.items() if not field.description]
        assert not missing, f"{model.__name__}: {missing}"
