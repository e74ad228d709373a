"""Policy losses against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.policy_loss_base import PolicyLossInputs

EXPECTED_NAMES = {
    "vanilla",
    "gspo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dppo_tv",
    "dppo_kl",
    "sapo",
    "cispo",
}


def make_inputs(
    ratios: list[float], advantages: list[float], old_probs: list[float] | None = None
) -> PolicyLossInputs:
    """One sequence of len(ratios) response tokens; log_prob is a leaf with grad."""
    old = torch.tensor(old_probs or [0.5] * len(ratios), dtype=torch.float64).log().unsqueeze(0)
    log_prob = (old + torch.tensor(ratios, dtype=torch.float64).log()).detach().requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    return PolicyLossInputs(old, log_prob, adv, torch.ones_like(adv))


def loss_and_grad(
    name: str, inputs: PolicyLossInputs, **cfg: object
) -> tuple[list[float], list[float], dict]:
    per_token, metrics = POLICY_LOSSES.get(name)(inputs, PolicyLossConfig(policy_loss=name, **cfg))
    per_token.sum().backward()
    return per_token[0].tolist(), inputs.log_prob.grad[0].tolist(), metrics


def test_every_loss_is_registered() -> None:
    assert set(POLICY_LOSSES.names()) >= EXPECTED_NAMES


def test_vanilla_clip_and_dual_clip() -> None:
    # eps = 0.2, c = 3.
    # r=1.5, A=+1: max(-1.5, -1.2) = -1.2 (clipped, no grad)
    # r=0.5, A=+1: max(-0.5, -0.8) = -0.5 (grad -A*r = -0.5)
    # r=1.1, A=-1: max(1.1, 1.1) = 1.1, below c*|A| = 3 (grad -A*r = 1.1)
    # r=5.0, A=-1: max(5, 1.2) = 5 -> dual clip min(5, 3) = 3 (no grad)
    loss, grad, metrics = loss_and_grad("vanilla", make_inputs([1.5, 0.5, 1.1, 5.0], [1, 1, -1, -1]))
    assert loss == pytest.approx([-1.2, -0.5, 1.1, 3.0])
    assert grad == pytest.approx([0.0, -0.5, 1.1, 0.0])
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.25)
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(0.25)


def test_gpg_is_plain_policy_gradient() -> None:
    # loss = -A * log pi -> d/dlogp = -A whatever the ratio.
    _, grad, _ = loss_and_grad("gpg", make_inputs([3.0, 0.1], [2.0, -1.0]))
    assert grad == pytest.approx([-2.0, 1.0])


def test_gspo_uses_the_sequence_ratio() -> None:
    # log-ratios [log 1.2, log(1/1.2)] average to 0 -> s = 1, inside the clip: loss = -A, grad = -A.
    loss, grad, _ = loss_and_grad("gspo", make_inputs([1.2, 1 / 1.2], [1.0, 1.0]))
    assert loss == pytest.approx([-1.0, -1.0])
    assert grad == pytest.approx([-1.0, -1.0])
    # log-ratios [0.3, 0.1] average 0.2 -> s = e^0.2 = 1.2214 > 1 + 4e-4 with A > 0: clipped, no grad.
    loss, grad, _ = loss_and_grad("gspo", make_inputs([math.exp(0.3), math.exp(0.1)], [1.0, 1.0]))
    assert loss == pytest.approx([-1.0004, -1.0004])
    assert grad == pytest.approx([0.0, 0.0])


@pytest.mark.parametrize(
    ("adv", "expected"),
    [
        # A > 0: per-token min(lr, clip(lr, -0.4, 0.4)) = [0.4, -0.2] -> mean 0.1 -> -e^0.1
        (1.0, -math.exp(0.1)),
        # A < 0: max(lr, clip(lr)) = [0.6, -0.2] -> mean 0.2 -> +e^0.2
        (-1.0, math.exp(0.2)),
    ],
)
def test_geo_mean_clips_in_log_space(adv: float, expected: float) -> None:
    loss, _, _ = loss_and_grad("geo_mean", make_inputs([math.exp(0.6), math.exp(-0.2)], [adv, adv]))
    assert loss == pytest.approx([expected, expected])


@pytest.mark.parametrize(
    ("name", "log_ratios", "expected"),
    [
        # gspo, A = -1: mean of the raw log-ratios (25 - 5 - 5) / 3 = 5 -> s = e^5 = 148.41, above the
        # clip, so loss = max(-A s, -A clip(s)) = e^5 on every token. Clamping the 25 to 20 first
        # would give e^(10/3) = 28.03.
        ("gspo", [25.0, -5.0, -5.0], math.exp(5.0)),
        # geo_mean, A = -1: pessimistic side max(lr, clip(lr, -0.4, 0.4)) = [25, -0.4, -0.4],
        # mean 24.2 / 3 -> loss e^8.0667 = 3186.5 (per-token clamping: e^6.4 = 601.8).
        ("geo_mean", [25.0, -5.0, -5.0], math.exp(24.2 / 3)),
        # geo_mean, A = -1: [45, 0, 0] -> mean 15 stays below the bound: e^15.
        ("geo_mean", [45.0, 0.0, 0.0], math.exp(15.0)),
        # geo_mean, A = -1: [45, 30, 0] -> mean 25, and only the aggregate is bounded: e^20.
        ("geo_mean", [45.0, 30.0, 0.0], math.exp(20.0)),
    ],
)
def test_sequence_ratios_bound_the_aggregate_not_the_tokens(
    name: str, log_ratios: list[float], expected: float
) -> None:
    # Old probabilities small enough that pi = pi_old * e^lr stays a probability.
    inputs = make_inputs([math.exp(x) for x in log_ratios], [-1.0] * 3, old_probs=[math.exp(-50.0)] * 3)
    loss, _, _ = loss_and_grad(name, inputs)
    assert loss == pytest.approx([expected] * 3, rel=1e-9)


def test_sapo_soft_gate() -> None:
    # r = 1: loss = -A * (4 / tau) * sigmoid(0) = -2 A / tau; gradient weight 4 s (1 - s) = 1 -> -A.
    loss, grad, _ = loss_and_grad("sapo", make_inputs([1.0, 1.0], [1.0, -1.0]))
    assert loss == pytest.approx([-2.0, 2.0 / 1.05])
    assert grad == pytest.approx([-1.0, 1.0])
    # r = 2, A = 1, tau = 1: s = sigmoid(1) = 0.731059; loss = -4 s; grad = -4 s (1 - s) * r.
    s = 1 / (1 + math.exp(-1))
    loss, grad, _ = loss_and_grad("sapo", make_inputs([2.0], [1.0]))
    assert loss == pytest.approx([-4 * s])
    assert grad == pytest.approx([-4 * s * (1 - s) * 2])


def test_cispo_keeps_gradient_of_clipped_tokens() -> None:
    # w = sg(clip(r, 0, 1.28)) = [1.28, 0.5]; d/dlogp (-A w log pi) = -A w.
    _, grad, _ = loss_and_grad("cispo", make_inputs([1.5, 0.5], [1.0, 1.0]))
    assert grad == pytest.approx([-1.28, -0.5])


def test_dppo_tv_masks_only_harmful_moves_outside_region() -> None:
    # token 0: 0.5 -> 0.7, TV 0.2 > 0.15, A > 0 pushes up further: blocked (loss 0).
    # token 1: 0.5 -> 0.7 but A < 0 pulls it back: kept, loss -A r = 1.4.
    # token 2: 0.5 -> 0.6, TV 0.1: kept, loss -1.2.
    # token 3: 0.01 -> 0.03, ratio 3 (PPO would clip) but TV 0.02: kept, loss -3.
    inputs = make_inputs([1.4, 1.4, 1.2, 3.0], [1, -1, 1, 1], old_probs=[0.5, 0.5, 0.5, 0.01])
    loss, grad, metrics = loss_and_grad("dppo_tv", inputs)
    assert loss == pytest.approx([0.0, 1.4, -1.2, -3.0])
    assert grad == pytest.approx([0.0, 1.4, -1.2, -3.0])
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.25)


def test_dppo_kl_binary_divergence() -> None:
    # p = 0.5, q = 0.7: KL = 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.0872 > 0.05: blocked for A > 0;
    # q = 0.55: KL = 0.00503 < 0.05: kept, loss -1.1.
    loss, _, _ = loss_and_grad("dppo_kl", make_inputs([1.4, 1.1], [1.0, 1.0]))
    assert loss == pytest.approx([0.0, -1.1])


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_truncates_the_ratio_at_clip_ratio_c(name: str) -> None:
    # Rare tokens: every step is inside both regions (TV <= 0.04; binary KL <= 0.025), so none is
    # blocked, and only the truncation at c = 3 limits them. loss = -A * min(r, 3), and
    # d loss / d log pi = -A * min(r, 3):
    # 0.01 -> 0.02 (r = 2, A = +1): -2; 0.01 -> 0.025 (r = 2.5, A = +1): -2.5;
    # 0.01 -> 0.05 (r = 5, A = +1): -3, not -5; 0.001 -> 0.01 (r = 10, A = -1): +3, not +10.
    inputs = make_inputs([2.0, 2.5, 5.0, 10.0], [1, 1, 1, -1], old_probs=[0.01, 0.01, 0.01, 0.001])
    loss, grad, metrics = loss_and_grad(name, inputs)
    assert loss == pytest.approx([-2.0, -2.5, -3.0, 3.0])
    assert grad == pytest.approx([-2.0, -2.5, -3.0, 3.0])
    assert float(metrics["actor/pg_clipfrac"]) == 0.0
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(0.5)  # r = 5 and r = 10


def test_clip_cov_detaches_high_covariance_tokens() -> None:
    # ratio 1 everywhere. A = [1, -1, 1, -1], log pi = [-1, -1, -3, -3]: means 0 and -2, so
    # cov = [1, -1, -1, 1]; with lb 0.5 the candidates are tokens 0 and 3. clip_cov_ratio 1 picks
    # both: their grads vanish; tokens 1, 2 keep -A = [1, -1].
    old = torch.tensor([[-1.0, -1.0, -3.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    inputs = PolicyLossInputs(old, old.clone().requires_grad_(True), adv, torch.ones_like(adv))
    _, grad, metrics = loss_and_grad("clip_cov", inputs, clip_cov_ratio=1.0, clip_cov_lb=0.5)
    assert grad == pytest.approx([0.0, 1.0, -1.0, 0.0])
    # ratio 0.25 -> max(1, int(0.25 * 4)) = 1 token detached, chosen among the candidates.
    torch.manual_seed(0)
    inputs = PolicyLossInputs(old, old.clone().requires_grad_(True), adv, torch.ones_like(adv))
    _, grad, metrics = loss_and_grad("clip_cov", inputs, clip_cov_ratio=0.25, clip_cov_lb=0.5)
    assert float(metrics["actor/cov_detached_frac"]) == pytest.approx(0.25)
    assert sorted(grad[i] for i in (0, 3)) == pytest.approx([0.0, 1.0])


def test_kl_cov_penalises_top_covariance_token() -> None:
    # log pi = [-1, -1, -3, -4] (mean -2.25), A = [1, -1, 1, -1]:
    # cov = [1.25, -1.25, -0.75, 1.75] -> top 1 (ratio 0.25 of 4 tokens) is token 3.
    # Token 3 has log-ratio 0.2: loss = -A e^0.2 + |0.2| = 1.22140 + 0.2.
    log_prob = torch.tensor([[-1.0, -1.0, -3.0, -4.0]], dtype=torch.float64)
    old = log_prob - torch.tensor([[0.0, 0.0, 0.0, 0.2]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    inputs = PolicyLossInputs(old, log_prob.clone().requires_grad_(True), adv, torch.ones_like(adv))
    loss, _, _ = loss_and_grad("kl_cov", inputs, kl_cov_ratio=0.25)
    assert loss == pytest.approx([-1.0, 1.0, -1.0, math.exp(0.2) + 0.2])


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "sapo", "cispo", "dppo_tv", "dppo_kl", "kl_cov"])
def test_on_policy_gradient_is_minus_advantage(name: str) -> None:
    # At pi = pi_old every clipped / gated / reweighted surrogate reduces to d/dlogp = -A.
    adv = [0.7, -1.3, 2.0, -0.1]
    _, grad, _ = loss_and_grad(name, make_inputs([1.0] * 4, adv))
    assert grad == pytest.approx([-a for a in adv])


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES - {"clip_cov"}))
def test_is_weights_scale_the_loss_and_carry_no_grad(name: str) -> None:
    base = make_inputs([1.1, 0.9, 1.0], [1.0, -0.5, 2.0])
    plain, _ = POLICY_LOSSES.get(name)(base, PolicyLossConfig(policy_loss=name))
    weights = torch.tensor([[2.0, 0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    weighted_inputs = PolicyLossInputs(
        base.old_log_prob, base.log_prob, base.advantages, base.response_mask, weights
    )
    weighted, _ = POLICY_LOSSES.get(name)(weighted_inputs, PolicyLossConfig(policy_loss=name))
    assert torch.allclose(weighted, plain * weights.detach())
    weighted.sum().backward()
    assert weights.grad is None
