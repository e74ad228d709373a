"""Numerical cross-check: our functions vs. straightforward float64 loops written from SPEC's formulas.

The references below use Python floats and explicit loops only; they never call library code.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from rl_train.algorithms.advantage import ADV_ESTIMATORS
from rl_train.algorithms.advantage_base import AdvantageInputs
from rl_train.algorithms.aggregation import aggregate_loss
from rl_train.algorithms.config import AlgorithmConfig, PolicyLossConfig, RolloutCorrectionConfig
from rl_train.algorithms.kl import kl_penalty
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.policy_loss_base import PolicyLossInputs
from rl_train.algorithms.rollout_correction import compute_rollout_correction

B, T = 6, 9


def random_batch(seed: int) -> dict[str, list[list[float]]]:
    rng = random.Random(seed)
    mask = []
    for _ in range(B):
        start, length = rng.randint(0, 3), rng.randint(1, 5)
        mask.append([1.0 if start <= t < start + length else 0.0 for t in range(T)])
    return {
        "mask": mask,
        "rewards": [[rng.uniform(-1, 1) * m for m in row] for row in mask],
        "values": [[rng.uniform(-1, 1) for _ in range(T)] for _ in range(B)],
        "old": [[rng.uniform(-3, -0.1) for _ in range(T)] for _ in range(B)],
        "new": [[rng.uniform(-3, -0.1) for _ in range(T)] for _ in range(B)],
        "adv": [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(B)],
    }


def t64(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def ref_grpo(scores: list[float], groups: list[str]) -> list[float]:
    out = []
    for i, g in enumerate(groups):
        members = [scores[j] for j in range(len(scores)) if groups[j] == g]
        n = len(members)
        if n < 2:
            out.append(0.0)
            continue
        mean = sum(members) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (n - 1))
        out.append((scores[i] - mean) / (std + 1e-6))
    return out


def ref_gae(
    rewards: list[float], values: list[float], mask: list[float], gamma: float, lam: float
) -> list[float]:
    """Returns (A + V) on masked tokens: positions with mask 0 are skipped entirely."""
    idx = [t for t in range(len(mask)) if mask[t] > 0]
    adv = {}
    last, next_v = 0.0, 0.0
    for t in reversed(idx):
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
        next_v = values[t]
    return [adv[t] + values[t] if t in adv else 0.0 for t in range(len(mask))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_and_rloo_match_reference(seed: int) -> None:
    data = random_batch(seed)
    groups = ["a", "a", "a", "b", "b", "c"]
    scores = [sum(r) for r in data["rewards"]]
    inputs = AdvantageInputs(t64(data["rewards"]), t64(data["mask"]), groups)
    adv, _ = ADV_ESTIMATORS.get("grpo")(inputs, AlgorithmConfig())
    expected = ref_grpo(scores, groups)
    for i in range(B):
        for t in range(T):
            assert float(adv[i, t]) == pytest.approx(expected[i] * data["mask"][i][t], abs=1e-12)
    adv, _ = ADV_ESTIMATORS.get("rloo")(inputs, AlgorithmConfig(adv_estimator="rloo"))
    for i, g in enumerate(groups):
        others = [scores[j] for j in range(B) if groups[j] == g and j != i]
        want = scores[i] - sum(others) / len(others) if others else 0.0
        assert float(adv[i][torch.tensor(data["mask"][i]).bool()][0]) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("seed", [3, 4])
def test_gae_returns_match_reference(seed: int) -> None:
    data = random_batch(seed)
    inputs = AdvantageInputs(t64(data["rewards"]), t64(data["mask"]), ["a"] * B, values=t64(data["values"]))
    _, returns = ADV_ESTIMATORS.get("gae")(inputs, AlgorithmConfig(adv_estimator="gae", gamma=0.9, lam=0.8))
    for i in range(B):
        expected = ref_gae(data["rewards"][i], data["values"][i], data["mask"][i], 0.9, 0.8)
        assert returns[i].tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", [5, 6])
def test_ppo_token_mean_loss_matches_reference(seed: int) -> None:
    data = random_batch(seed)
    eps_low, eps_high, c = 0.2, 0.28, 3.0
    total, count = 0.0, 0.0
    for i in range(B):
        for t in range(T):
            if not data["mask"][i][t]:
                continue
            r = math.exp(data["new"][i][t] - data["old"][i][t])
            a = data["adv"][i][t]
            loss = max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))
            if a < 0:
                loss = min(loss, -a * c)
            total, count = total + loss, count + 1
    inputs = PolicyLossInputs(t64(data["old"]), t64(data["new"]), t64(data["adv"]), t64(data["mask"]))
    per_token, _ = POLICY_LOSSES.get("vanilla")(inputs, PolicyLossConfig(clip_ratio_high=eps_high))
    numerator, denominator = aggregate_loss(per_token, t64(data["mask"]), "token-mean")
    assert float(numerator) / denominator == pytest.approx(total / count, abs=1e-12)


@pytest.mark.parametrize("seed", [7, 8])
def test_is_weights_and_k3_match_reference(seed: int) -> None:
    data = random_batch(seed)
    old, rollout, mask = t64(data["old"]), t64(data["new"]), t64(data["mask"])
    cfg = RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold="0.2_3.0")
    weights, _, metrics = compute_rollout_correction(old, rollout, mask, cfg)
    assert weights is not None
    k3_sum, n = 0.0, 0
    for i in range(B):
        log_ratio = sum((data["old"][i][t] - data["new"][i][t]) * data["mask"][i][t] for t in range(T))
        w = math.exp(max(-20.0, min(20.0, log_ratio)))
        w = w if 0.2 <= w <= 3.0 else 0.0
        for t in range(T):
            assert float(weights[i, t]) == pytest.approx(w * data["mask"][i][t], abs=1e-12)
            if data["mask"][i][t]:
                lr = data["old"][i][t] - data["new"][i][t]
                k3_sum, n = k3_sum + math.exp(lr) - 1 - lr, n + 1
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(k3_sum / n, abs=1e-12)
    # reference-KL k3 (policy vs ref): exp(ref - pi) - 1 + (pi - ref)
    k3 = kl_penalty(rollout, old, "k3")
    d = data["new"][0][0] - data["old"][0][0]
    assert float(k3[0, 0]) == pytest.approx(math.exp(-d) - 1 + d, abs=1e-12)


def clamp_exp(x: float) -> float:
    """The reference's guard: exp of x clamped to +-20, applied to the value being exponentiated."""
    return math.exp(max(-20.0, min(20.0, x)))


@pytest.mark.parametrize("seed", [9, 10, 11])
def test_sequence_ratios_with_extreme_tokens_match_reference(seed: int) -> None:
    """One token per sequence pushed past +-20: sequence IS, gspo and geo_mean aggregate raw log-ratios."""
    data = random_batch(seed)
    for i in range(B):  # first response token of each row: log-ratio +-(21..30)
        t = data["mask"][i].index(1.0)
        data["new"][i][t] = data["old"][i][t] + random.Random(seed + i).choice([-1, 1]) * (21 + i)
    old, new, adv, mask = t64(data["old"]), t64(data["new"]), t64(data["adv"]), t64(data["mask"])
    cfg = RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold="1e9")
    weights, _, _ = compute_rollout_correction(old, new, mask, cfg)  # here "new" plays the rollout
    inputs = PolicyLossInputs(old, new, adv, mask)
    gspo, _ = POLICY_LOSSES.get("gspo")(inputs, PolicyLossConfig(policy_loss="gspo"))
    geo, _ = POLICY_LOSSES.get("geo_mean")(inputs, PolicyLossConfig(policy_loss="geo_mean"))
    assert weights is not None
    for i in range(B):
        idx = [t for t in range(T) if data["mask"][i][t]]
        lr = [data["new"][i][t] - data["old"][i][t] for t in idx]  # log(pi / pi_old)
        w = clamp_exp(-sum(lr))  # IS: log(pi_old / pi_rollout) summed, clamped once
        s = math.exp(min(10.0, sum(lr) / len(lr)))  # gspo caps the mean log-ratio at 10
        pess = [
            max(x, max(-0.4, min(0.4, x))) if data["adv"][i][t] < 0 else min(x, max(-0.4, min(0.4, x)))
            for x, t in zip(lr, idx, strict=True)
        ]
        seq_adv = sum(data["adv"][i][t] for t in idx) / len(idx)
        for t in idx:
            a = data["adv"][i][t]
            assert float(weights[i, t]) == pytest.approx(w, rel=1e-12)
            want_gspo = max(-a * s, -a * min(max(s, 1 - 3e-4), 1 + 4e-4))
            assert float(gspo[i, t]) == pytest.approx(want_gspo, rel=1e-12)
            assert float(geo[i, t]) == pytest.approx(-seq_adv * clamp_exp(sum(pess) / len(pess)), rel=1e-12)


@pytest.mark.parametrize("seed", [12, 13])
@pytest.mark.parametrize("option", ["token_k1", "seq_sum_k1", "seq_mean_k1"])
def test_asymmetric_k1_rejection_matches_reference(seed: int, option: str) -> None:
    """"lo_hi" k1 bounds: keep iff ln lo <= k1 statistic <= ln hi, k1 = log pi_rollout - log pi_old."""
    data = random_batch(seed)
    lo, hi = 0.5, 3.0
    cfg = RolloutCorrectionConfig(rollout_rs=option, rollout_rs_threshold=f"{lo}_{hi}")
    _, new_mask, _ = compute_rollout_correction(t64(data["old"]), t64(data["new"]), t64(data["mask"]), cfg)
    for i in range(B):
        idx = [t for t in range(T) if data["mask"][i][t]]
        k1 = {t: data["new"][i][t] - data["old"][i][t] for t in idx}  # "new" plays the rollout
        seq = sum(k1.values()) / (len(idx) if option == "seq_mean_k1" else 1)
        for t in range(T):
            stat = k1.get(t, 0.0) if option == "token_k1" else seq
            keep = t in k1 and math.log(lo) <= stat <= math.log(hi)
            assert float(new_mask[i, t]) == float(keep), (i, t)
