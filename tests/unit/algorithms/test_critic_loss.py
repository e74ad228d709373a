"""The critic's loss function (R-4.3 contract around the clipped value loss) and explained variance."""

from __future__ import annotations

import pytest
import torch

from rl_train.algorithms.config import ValueLossConfig
from rl_train.algorithms.critic_loss import build_critic_loss_fn, explained_variance


def test_critic_loss_is_the_clipped_value_loss_over_the_mask() -> None:
    # V_old = 0, cliprange 0.5, returns 1. Token 1: V = 0.8 is clipped to 0.5, so
    # max((0.8 - 1)^2, (0.5 - 1)^2) = 0.25 -> 0.125 (clipped). Token 2: V = 0.2 stays,
    # (0.2 - 1)^2 = 0.64 -> 0.32. Token 3 is padding (mask 0) with a huge error.
    # token-mean: (0.125 + 0.32) / 2 tokens; clipfrac 1/2; values mean (0.8 + 0.2) / 2.
    values = torch.tensor([[0.8, 0.2, 50.0]], requires_grad=True)
    micro_batch = {
        "values": torch.zeros(1, 3),
        "returns": torch.tensor([[1.0, 1.0, 0.0]]),
        "response_mask": torch.tensor([[1.0, 1.0, 0.0]]),
    }
    numerator, denominator, metrics = build_critic_loss_fn(ValueLossConfig(cliprange_value=0.5))(
        {"values": values}, micro_batch
    )
    assert float(numerator.detach()) == pytest.approx(0.445)
    assert denominator == 2.0
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["critic/values_mean"] == pytest.approx(0.5)
    numerator.backward()
    # d/dV: the clipped token has no gradient (its max is the constant clipped branch); the
    # other gets (V - R) = -0.8; padding none.
    assert values.grad[0].tolist() == pytest.approx([0.0, -0.8, 0.0])


def test_explained_variance_hand_computed() -> None:
    # R = [1, 1, 0], V = [0.5, 1, 0]: Var(R) = 1/3, Var(R - V) = Var([0.5, 0, 0]) = 1/12 (both
    # unbiased) -> 1 - (1/12) / (1/3) = 0.75. The padded 4th token is ignored.
    returns = torch.tensor([[1.0, 1.0, 0.0, 9.0]])
    values = torch.tensor([[0.5, 1.0, 0.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.75)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


def test_explained_variance_of_constant_returns_is_zero_not_huge() -> None:
    # GAE returns of an all-zero-reward batch are rounding noise around 0.
    returns = torch.tensor([[1e-10, -2e-10, 0.0]])
    values = torch.tensor([[0.1, 0.05, 0.2]])
    assert explained_variance(values, returns, torch.ones(1, 3)) == 0.0
