"""The advantage phase feeds GAE the critic's values and ReMax the greedy baseline, from the records."""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.algorithms.advantage_phase import AdvantagePhase
from rl_train.algorithms.config import AlgorithmConfig


def record(group: str, reward: float, length: int, **extra: Any) -> dict[str, Any]:
    """A trajectory as the earlier phases leave it (on-policy: old == rollout log-probs)."""
    log_probs = [-1.0] * length
    return {
        "group_id": group,
        "reward": reward,
        "response_ids": list(range(length)),
        "old_log_probs": log_probs,
        "rollout_log_probs": log_probs,
        **extra,
    }


def phase(estimator: str) -> AdvantagePhase:
    return AdvantagePhase.from_config(AlgorithmConfig(adv_estimator=estimator))


def test_gae_reads_values_and_writes_returns_for_the_critic() -> None:
    # gamma = lam = 1. Record a: r = [0, 1], V = [0.5, 0.8]: A1 = 1 - 0.8 = 0.2,
    # A0 = (0 + 0.8 - 0.5) + 0.2 = 0.5, returns = A + V = [1, 1]. Record b: r = [0], V = [0.2]:
    # A = -0.2, returns = [0]. Whitened over the 3 tokens [0.5, 0.2, -0.2]: mean 1/6, unbiased
    # var ((1/3)^2 + (1/30)^2 + (11/30)^2) / 2 = 0.12333.
    records = [record("g", 1.0, 2, values=[0.5, 0.8]), record("g", 0.0, 1, values=[0.2])]
    updates, _ = phase("gae").compute(records)
    assert updates[0]["returns"] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert updates[1]["returns"] == pytest.approx([0.0], abs=1e-6)
    std = ((1 / 9 + 1 / 900 + 121 / 900) / 2) ** 0.5
    expected = [(0.5 - 1 / 6) / std, (0.2 - 1 / 6) / std, (-0.2 - 1 / 6) / std]
    assert updates[0]["advantages"] + updates[1]["advantages"] == pytest.approx(expected, abs=1e-5)


def test_gae_without_values_names_the_missing_phase() -> None:
    with pytest.raises(ValueError, match="the values phase must run first"):
        phase("gae").compute([record("g", 1.0, 2)])


def test_remax_subtracts_each_trajectorys_baseline_reward() -> None:
    # Outcome reward on the last token, undiscounted return-to-go: every token of a carries
    # 1 - 0.4 = 0.6, of b 0 - 0.4 = -0.4; of c (another prompt, greedy answer scored 1) 1 - 1 = 0.
    records = [
        record("g", 1.0, 2, baseline_reward=0.4),
        record("g", 0.0, 1, baseline_reward=0.4),
        record("h", 1.0, 3, baseline_reward=1.0),
    ]
    updates, metrics = phase("remax").compute(records)
    assert [u["advantages"] for u in updates] == [
        pytest.approx([0.6, 0.6]),
        pytest.approx([-0.4]),
        pytest.approx([0.0, 0.0, 0.0]),
    ]
    assert all("returns" not in u for u in updates)  # no critic to train
    assert metrics["advantage/mean"] == pytest.approx((0.6 * 2 - 0.4) / 6)


def test_remax_without_baseline_names_the_missing_phase() -> None:
    with pytest.raises(ValueError, match="the greedy_baseline phase must run first"):
        phase("remax").compute([record("g", 1.0, 2, baseline_reward=0.0), record("g", 0.0, 1)])


def test_estimators_without_needs_ignore_values_and_baselines() -> None:
    plain = [record("g", 1.0, 2), record("g", 0.0, 1)]
    extra = [dict(r, values=[9.0] * len(r["response_ids"]), baseline_reward=5.0) for r in plain]
    assert phase("grpo").compute(plain)[0] == phase("grpo").compute(extra)[0]
