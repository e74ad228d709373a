"""Loss aggregation (split independence), KL estimators, KL controllers and the value loss."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_train.algorithms.aggregation import AGGREGATORS, aggregate_loss
from rl_train.algorithms.config import KLControlConfig
from rl_train.algorithms.kl import kl_penalty
from rl_train.algorithms.kl_controller import apply_kl_penalty_to_rewards, build_kl_controller
from rl_train.algorithms.value_loss import compute_value_loss, entropy_from_logits

LOSS = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 9.0, 4.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 4 response tokens
        ("token-sum", 10.0),  # denominator 0, clamped to 1 by the engine
        ("seq-mean-token-sum", (6 + 4) / 2),  # per-sequence sums 6 and 4
        ("seq-mean-token-mean", (2 + 4) / 2),  # per-sequence means 6/3 and 4/1
        ("seq-mean-token-sum-norm", (6 / 8 + 4 / 8) / 2),  # L = 8
    ],
)
def test_aggregation_hand_values(mode: str, expected: float) -> None:
    numerator, denominator = aggregate_loss(LOSS, MASK, mode, norm_length=8)
    assert float(numerator) / max(denominator, 1.0) == pytest.approx(expected)


def test_unknown_mode_lists_available() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "mean")


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=2, max_size=8),
    cuts=st.lists(st.integers(1, 7), max_size=3),
    mode=st.sampled_from(sorted(AGGREGATORS.names())),
    seed=st.integers(0, 2**16),
)
def test_loss_and_grad_do_not_depend_on_the_split(
    lengths: list[int], cuts: list[int], mode: str, seed: int
) -> None:
    # Each micro-batch is re-padded to its own width (as a dynamic batcher does), the engine sums
    # numerators / denominators and divides once; loss and gradient must match the whole batch.
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    mask = torch.zeros(len(lengths), width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, 1 : 1 + n] = 1
    leaf = torch.randn(len(lengths), width, generator=gen, dtype=torch.float64, requires_grad=True)

    def total(pieces: list[slice]) -> torch.Tensor:
        nums, dens = [], 0.0
        for piece in pieces:
            rows = mask[piece]
            used = int(rows.sum(dim=0).nonzero().max()) + 2 if rows.sum() > 0 else 1
            num, den = aggregate_loss(leaf[piece, :used] ** 2, rows[:, :used], mode, norm_length=7)
            nums.append(num)
            dens += den
        return torch.stack(nums).sum() / max(dens, 1.0)

    bounds = sorted({0, len(lengths), *(c for c in cuts if c < len(lengths))})
    whole = total([slice(0, len(lengths))])
    (whole_grad,) = torch.autograd.grad(whole, leaf)
    split = total([slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)])
    (split_grad,) = torch.autograd.grad(split, leaf)
    assert float(split.detach()) == pytest.approx(float(whole.detach()), rel=1e-12, abs=1e-12)
    assert torch.allclose(split_grad, whole_grad, atol=1e-12)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # log_ratio = log pi - log ref = [0.5, -0.5, 30]; k1, abs and k2 never exponentiate, so they
        # see the raw 30 (as the reference computes them): k2 = 0.5 * 30^2 = 450.
        ("k1", [0.5, -0.5, 30.0]),
        ("abs", [0.5, 0.5, 30.0]),
        ("k2", [0.125, 0.125, 450.0]),
        ("mse", [0.125, 0.125, 450.0]),
        # k3 = exp(-lr) - 1 + lr: e^-0.5 - 0.5 = 0.106531; e^0.5 - 1.5 = 0.148721;
        # lr = 30: e^-20 (bounded exp) - 1 + 30 = 29 -> clamp 10
        ("k3", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 10.0]),
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 10.0]),
    ],
)
def test_kl_estimators(kind: str, expected: list[float]) -> None:
    log_prob = torch.tensor([0.5, -0.5, 30.0], dtype=torch.float64)
    assert kl_penalty(log_prob, torch.zeros(3, dtype=torch.float64), kind).tolist() == pytest.approx(expected)


def test_k3_is_clamped_below_too() -> None:
    # lr = -20: e^20 - 21 is huge -> clamped to 10 (k3 >= 0 so the lower clamp never binds).
    assert float(kl_penalty(torch.tensor([-25.0]), torch.tensor([0.0]), "k3")) == 10.0


def test_adaptive_controller_moves_towards_target() -> None:
    # kl = 0.3, target 0.1: error = clip(3 - 1, +-0.2) = 0.2; beta *= 1 + 0.2 * 100 / 1000 = 1.02.
    ctrl = build_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.5, target_kl=0.1, horizon=1000))
    ctrl.update(0.3, n_steps=100)
    assert ctrl.value == pytest.approx(0.51)
    # kl = 0.05: error = -0.5 -> -0.2; beta *= 1 - 0.02.
    ctrl.update(0.05, n_steps=100)
    assert ctrl.value == pytest.approx(0.51 * 0.98)
    fixed = build_kl_controller(KLControlConfig(kl_coef=0.5))
    fixed.update(10.0, n_steps=100)
    assert fixed.value == 0.5


def test_kl_in_reward() -> None:
    # k1 per token = [0.2, 0.4] on the response, beta = 0.5: rewards [1 - 0.1, 0 - 0.2];
    # controller KL = mean of the sequence's token-mean = 0.3.
    scores = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    log_prob = torch.tensor([[5.0, 0.2, 0.4]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64)
    ctrl = build_kl_controller(KLControlConfig(kl_coef=0.5))
    rewards, metrics = apply_kl_penalty_to_rewards(scores, log_prob, torch.zeros_like(log_prob), mask, ctrl)
    assert rewards[0].tolist() == pytest.approx([0.0, 0.9, -0.2])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.3)


def test_clipped_value_loss() -> None:
    # old 0, clip 0.5. v=1.0, R=1.0: clipped v=0.5 -> max(0, 0.25) * 0.5 = 0.125 (clipped).
    # v=0.2, R=1.0: unclipped (0.64) = clipped (0.64) -> 0.32.  v=-2, R=0: max(4, 0.25) * 0.5 = 2.
    values = torch.tensor([[1.0, 0.2, -2.0]], dtype=torch.float64)
    returns = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics = compute_value_loss(
        values, torch.zeros_like(values), returns, torch.ones_like(values), 0.5
    )
    assert loss[0].tolist() == pytest.approx([0.125, 0.32, 2.0])
    assert float(metrics["critic/vf_clipfrac"]) == pytest.approx(1 / 3)


def test_vf_clipfrac_ignores_rounding_inside_the_range() -> None:
    # V_old = -0.1, V = 0.2, clip 0.5: |V - V_old| = 0.3 < 0.5, so nothing is clipped.
    # In float64, V - V_old = 0.30000000000000004 and V_old + that = 0.20000000000000004 != 0.2:
    # building V_clip as V_old + clip(V - V_old) made (V_clip - R)^2 > (V - R)^2 (R = 0) and
    # counted the token as clipped. clip(V, V_old - c, V_old + c) is V exactly: clipfrac 0,
    # loss 0.5 * 0.2^2 = 0.02.
    values = torch.tensor([[0.2]], dtype=torch.float64)
    old_values = torch.tensor([[-0.1]], dtype=torch.float64)
    loss, metrics = compute_value_loss(values, old_values, torch.zeros_like(values), torch.ones_like(values), 0.5)
    assert float(metrics["critic/vf_clipfrac"]) == 0.0
    assert float(loss[0, 0]) == 0.5 * 0.2**2


def test_entropy_from_logits() -> None:
    # uniform over 4 -> ln 4; one-hot-ish (logits 0, -inf-like) -> ~0.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -100.0, -100.0, -100.0]]], dtype=torch.float64)
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx([math.log(4), 0.0], abs=1e-9)
