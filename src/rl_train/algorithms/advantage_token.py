"""Token-level advantage estimators: GAE, REINFORCE++ and ReMax.

They walk the sequence backwards and rely only on the mask: a position with mask 0 (prompt,
padding, a tool observation between two turns) is skipped, the running value/return carried
across it unchanged, so a multi-turn response is discounted over generated tokens only.
Rewards must therefore sit on masked-in tokens (the reward phase puts them on the last
generated token). Sessions do not apply here: every output is its own trajectory.
"""

from __future__ import annotations

import torch

from rl_train.algorithms.advantage_base import AdvantageInputs
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.algorithms.masked import masked_whiten


def compute_gae_advantage(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016), [B, T] in and out.

    delta_t = r_t + gamma * V_next - V_t; A_t = delta_t + gamma * lam * A_next, where "next" is
    the next masked-in position (0 past the end). returns = A + V (unwhitened); the advantages
    are then whitened over the mask.
    """
    if inputs.values is None:
        raise ValueError("adv_estimator 'gae' needs critic values (the values phase writes them)")
    rewards, values = inputs.token_level_rewards, inputs.values.to(inputs.token_level_rewards.dtype)
    mask = inputs.response_mask.bool()
    next_value = torch.zeros_like(rewards[:, 0])
    last_gae = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + cfg.gamma * next_value - values[:, t]
        gae = delta + cfg.gamma * cfg.lam * last_gae
        advantages[:, t] = gae
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        last_gae = torch.where(mask[:, t], gae, last_gae)
    maskf = mask.to(rewards.dtype)
    returns = (advantages + values) * maskf
    return masked_whiten(advantages, mask), returns


def _discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next over masked-in positions; zero outside the mask."""
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        ret = rewards[:, t] + gamma * running
        returns[:, t] = ret
        running = torch.where(mask[:, t], ret, running)
    return returns * mask.to(rewards.dtype)


def compute_reinforce_plus_plus_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted token returns, whitened over the whole batch."""
    mask = inputs.response_mask.bool()
    returns = _discounted_returns(inputs.token_level_rewards, mask, cfg.gamma)
    return masked_whiten(returns, mask), returns


def compute_remax_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): undiscounted return-to-go minus the greedy response's reward."""
    if inputs.reward_baselines is None:
        raise ValueError(
            "adv_estimator 'remax' needs reward_baselines (the greedy_baseline phase's reward per sample)"
        )
    mask = inputs.response_mask.bool()
    returns = _discounted_returns(inputs.token_level_rewards, mask, 1.0)
    baseline = inputs.reward_baselines.to(returns.dtype).unsqueeze(-1)
    advantages = (returns - baseline) * mask.to(returns.dtype)
    return advantages, returns
