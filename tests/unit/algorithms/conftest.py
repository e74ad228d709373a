"""Shared builders for the algorithm tests: full-sequence [B, T] tensors with a prompt prefix."""

from __future__ import annotations

import pytest
import torch


def outcome_rewards(
    scores: list[float], lengths: list[int], prompt_len: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_level_rewards, response_mask) with each score on the sample's last response token.

    Sample i has ``prompt_len`` masked-out prompt positions, then ``lengths[i]`` response tokens,
    then right padding up to the longest sample.
    """
    width = prompt_len + max(lengths) + 1
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, prompt_len : prompt_len + length] = 1
        rewards[i, prompt_len + length - 1] = score
    return rewards, mask


@pytest.fixture
def make_outcome():  # noqa: ANN201 - fixture returning the builder above
    return outcome_rewards
