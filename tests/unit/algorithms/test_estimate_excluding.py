"""Leaving samples out of an advantage estimator (``estimate_excluding``, R-6.5): for every
registered estimator, the kept rows get exactly what the estimator gives the batch without the
left-out rows, and the left-out rows get zeros."""

from __future__ import annotations

import pytest
import torch

from rl_train.algorithms.advantage import ADV_ESTIMATORS
from rl_train.algorithms.advantage_base import AdvantageInputs, estimate_excluding
from rl_train.algorithms.config import AlgorithmConfig


def batch(generator: torch.Generator) -> AdvantageInputs:
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    scores = torch.randint(0, 2, (6,), generator=generator).float()
    rewards = torch.zeros(6, 3)
    rewards[torch.arange(6), mask.sum(1).long() - 1] = scores
    return AdvantageInputs(
        rewards,
        mask,
        ["a", "a", "a", "b", "b", "b"],
        values=torch.randn(6, 3, generator=generator) * mask,
        reward_baselines=torch.rand(6, generator=generator),
    )


def subset(inputs: AdvantageInputs, rows: list[int]) -> AdvantageInputs:
    values, baselines = inputs.values, inputs.reward_baselines
    assert values is not None and baselines is not None
    return AdvantageInputs(
        inputs.token_level_rewards[rows],
        inputs.response_mask[rows],
        [inputs.group_ids[i] for i in rows],
        values=values[rows],
        reward_baselines=baselines[rows],
    )


@pytest.mark.parametrize("name", list(ADV_ESTIMATORS))
def test_left_out_rows_change_nothing_for_the_others(name: str) -> None:
    estimator, algorithm = ADV_ESTIMATORS.get(name), AlgorithmConfig.model_validate({"adv_estimator": name})
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        inputs = batch(generator)
        excluded = torch.tensor([False, True, False, False, False, True])
        advantages, returns = estimate_excluding(estimator, inputs, excluded, algorithm)
        want_adv, want_ret = estimator(subset(inputs, [0, 2, 3, 4]), algorithm)
        torch.testing.assert_close(advantages[[0, 2, 3, 4]], want_adv)
        torch.testing.assert_close(returns[[0, 2, 3, 4]], want_ret)
        assert not advantages[[1, 5]].any() and not returns[[1, 5]].any()
        # Nothing left out: exactly the estimator itself.
        none = torch.zeros(6, dtype=torch.bool)
        torch.testing.assert_close(estimate_excluding(estimator, inputs, none, algorithm), estimator(inputs, algorithm))
    everything = torch.ones(6, dtype=torch.bool)
    advantages, returns = estimate_excluding(estimator, batch(generator), everything, algorithm)
    assert not advantages.any() and not returns.any()
