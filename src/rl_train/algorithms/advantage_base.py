"""What every advantage estimator takes, what it may need beyond it, and shared helpers.

Each estimator is ``fn(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> (advantages, returns)``,
both ``[B, T]`` and zero outside the response mask. The ``ADV_ESTIMATORS`` table is in
``advantage``, which names every estimator by import path.

Multi-output sessions (one agent session producing several trainable outputs): with
``session_ids`` set, only the last output of each session (in batch order) enters the group
statistics of the outcome estimators, and its advantage is broadcast to the session's other
outputs, so a long session does not count as several votes in its group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import AlgorithmConfig


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
    session_ids: Sequence[str] | None = None
    """Length B, optional: outputs of one multi-output session share an id."""
    reward_baselines: torch.Tensor | None = None
    """[B] reward of the greedy response to the same prompt, for ReMax."""


AdvantageFn = Callable[[AdvantageInputs, AlgorithmConfig], tuple[torch.Tensor, torch.Tensor]]


def group_indices(group_ids: Sequence[str]) -> list[list[int]]:
    """Sample indices of each group, groups in first-seen order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        groups[gid].append(i)
    return list(groups.values())


def session_representatives(num_samples: int, session_ids: Sequence[str] | None) -> list[int]:
    """For each sample, the index of the sample that represents its session (the session's last)."""
    if session_ids is None:
        return list(range(num_samples))
    last: dict[str, int] = {}
    for i, sid in enumerate(session_ids):
        last[sid] = i
    return [last[sid] for sid in session_ids]


def sequence_scores(inputs: AdvantageInputs) -> torch.Tensor:
    """[B] outcome score of each sample: its token rewards summed over the response mask."""
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    return (inputs.token_level_rewards * mask).sum(dim=-1)


def outcome_advantage(
    inputs: AdvantageInputs, group_fn: Callable[[torch.Tensor, list[int]], torch.Tensor]
) -> torch.Tensor:
    """[B] advantage per sample from ``group_fn(scores, group_member_indices) -> [n]``.

    ``group_fn`` sees only session representatives; the result is broadcast to each session.
    """
    scores = sequence_scores(inputs)
    reps = session_representatives(len(inputs.group_ids), inputs.session_ids)
    rep_set = sorted(set(reps))
    rep_groups: dict[str, list[int]] = defaultdict(list)
    for i in rep_set:
        rep_groups[inputs.group_ids[i]].append(i)
    per_rep = torch.zeros_like(scores)
    for members in rep_groups.values():
        per_rep[members] = group_fn(scores, members).to(scores.dtype)
    return per_rep[reps]


def broadcast_to_tokens(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: the sample's value on each of its response tokens, zero elsewhere."""
    return per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)


def estimate_excluding(
    estimator: AdvantageFn, inputs: AdvantageInputs, excluded: torch.Tensor, algorithm: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """``estimator`` on the rows not ``excluded`` ([B] bool) only, as if the others were absent:
    they take no part in any group's baseline or spread, and get zero advantages and returns.

    Why: a sample whose grader failed (``is_infra``, R-6.5) has no score; its placeholder 0
    would read as a wrong answer and pull its group's baseline down."""
    if not bool(excluded.any()):
        return estimator(inputs, algorithm)
    rows = torch.nonzero(~excluded).squeeze(-1)
    advantages = torch.zeros_like(inputs.token_level_rewards)
    returns = torch.zeros_like(inputs.token_level_rewards)
    if rows.numel() == 0:
        return advantages, returns
    kept = rows.tolist()
    subset = AdvantageInputs(
        inputs.token_level_rewards[rows],
        inputs.response_mask[rows],
        [inputs.group_ids[i] for i in kept],
        values=None if inputs.values is None else inputs.values[rows],
        session_ids=None if inputs.session_ids is None else [inputs.session_ids[i] for i in kept],
        reward_baselines=None if inputs.reward_baselines is None else inputs.reward_baselines[rows],
    )
    sub_advantages, sub_returns = estimator(subset, algorithm)
    advantages[rows] = sub_advantages.to(advantages.dtype)
    returns[rows] = sub_returns.to(returns.dtype)
    return advantages, returns
