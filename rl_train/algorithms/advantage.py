"""Advantage estimators, registered by name in ``ADV_ESTIMATORS``.

Each estimator is ``fn(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> (advantages, returns)``,
both ``[B, T]`` and zero outside the response mask.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import AlgorithmConfig
from rl_train.registry import Registry


@dataclass
class AdvantageInputs:
    """What an estimator may read. ``group_ids[i]`` names the prompt group of sample i."""

    token_level_rewards: torch.Tensor
    """[B, T] reward per token (outcome rewards sit on the last response token)."""
    response_mask: torch.Tensor
    """[B, T] 1 on graded response tokens."""
    group_ids: Sequence[str]
    """Length B: samples with the same id answer the same prompt."""
    values: torch.Tensor | None = None
    """[B, T] critic values, for GAE."""


AdvantageFn = Callable[[AdvantageInputs, AlgorithmConfig], tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def group_indices(group_ids: Sequence[str]) -> list[list[int]]:
    """Sample indices of each group, groups in first-seen order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        groups[gid].append(i)
    return list(groups.values())


@ADV_ESTIMATORS.register("grpo")
def compute_grpo_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: score_i = (r_i - mean_g) / (std_g + eps), broadcast over the response tokens.

    std is the unbiased sample std; a group of one has mean = its own score and std 0,
    so its advantage is exactly zero (no signal without a comparison).
    """
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    scores = (inputs.token_level_rewards * mask).sum(dim=-1)
    normalized = torch.zeros_like(scores)
    for idx in group_indices(inputs.group_ids):
        group = scores[idx]
        if len(idx) == 1:
            continue
        centred = group - group.mean()
        if cfg.norm_adv_by_std_in_grpo:
            centred = centred / (group.std(unbiased=True) + epsilon)
        normalized[idx] = centred
    advantages = normalized.unsqueeze(-1) * mask
    return advantages, advantages
