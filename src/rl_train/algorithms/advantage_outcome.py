"""Outcome advantage estimators: one scalar score per sample, a baseline from its prompt group.

Each estimator reduces a group's scores to per-sample advantages with a small pure function and
broadcasts the result over the response tokens (``returns`` equal ``advantages``). A group of one
sample has no comparison and gets zero advantage (some frameworks give it the raw score instead).
"""

from __future__ import annotations

import torch

from rl_train.algorithms.advantage_base import (
    AdvantageInputs,
    broadcast_to_tokens,
    outcome_advantage,
    session_representatives,
)
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.algorithms.masked import masked_whiten

EPSILON = 1e-6
"""Added to the group std so that a near-constant group cannot blow advantages up."""


def _grpo_group(scores: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    """[n] -> [n]: (s - mean) [/ (unbiased std + eps)]; zero for a group of one."""
    if scores.numel() < 2:
        return torch.zeros_like(scores)
    centred = scores - scores.mean()
    return centred / (scores.std(unbiased=True) + EPSILON) if norm_by_std else centred


def compute_grpo_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024): A_i = (s_i - mean_g) / (std_g + eps), std optional (Dr. GRPO drops it)."""
    per_sample = outcome_advantage(inputs, lambda s, m: _grpo_group(s[m], cfg.norm_adv_by_std_in_grpo))
    adv = broadcast_to_tokens(per_sample, inputs.response_mask)
    return adv, adv


def _passk_group(scores: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    """Only the best sample gets (best - second best) [/ (std + eps)]; the others get 0."""
    out = torch.zeros_like(scores)
    if scores.numel() < 2:
        return out
    top2 = torch.topk(scores, 2).values
    best = int(torch.argmax(scores))
    gap = top2[0] - top2[1]
    out[best] = gap / (scores.std(unbiased=True) + EPSILON) if norm_by_std else gap
    return out


def compute_grpo_passk_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025): credit only the group's best answer, by its margin."""
    per_sample = outcome_advantage(inputs, lambda s, m: _passk_group(s[m], cfg.norm_adv_by_std_in_grpo))
    adv = broadcast_to_tokens(per_sample, inputs.response_mask)
    return adv, adv


def _rloo_group(scores: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: A_i = s_i - mean of the other n-1 scores."""
    n = scores.numel()
    if n < 2:
        return torch.zeros_like(scores)
    return scores - (scores.sum() - scores) / (n - 1)


def compute_rloo_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): REINFORCE with a leave-one-out group baseline."""
    per_sample = outcome_advantage(inputs, lambda s, m: _rloo_group(s[m]))
    adv = broadcast_to_tokens(per_sample, inputs.response_mask)
    return adv, adv


def compute_opo_advantage(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025): length-weighted baseline b = sum(L_j s_j) / sum(L_j), A_i = s_i - b.

    L_j is the number of response tokens of sample j (the variance-optimal baseline for a
    sequence-level policy gradient under the token-sum loss).
    """
    lengths = inputs.response_mask.to(inputs.token_level_rewards.dtype).sum(dim=-1)

    def group_fn(scores: torch.Tensor, members: list[int]) -> torch.Tensor:
        s, length = scores[members], lengths[members]
        if s.numel() < 2:
            return torch.zeros_like(s)
        return s - (length * s).sum() / length.sum().clamp(min=1)

    adv = broadcast_to_tokens(outcome_advantage(inputs, group_fn), inputs.response_mask)
    return adv, adv


def compute_gpg_advantage(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025): group-centred score scaled by alpha = B / B_valid, never divided by the std.

    B counts the (session-representative) samples, B_valid those in groups whose scores are
    not all equal: the rescaling undoes the gradient shrinkage caused by zero-signal groups.
    The paper's normaliser F_norm is 1, so ``norm_adv_by_std_in_grpo`` (a GRPO knob) does not apply.
    """
    per_sample = outcome_advantage(inputs, lambda s, m: _grpo_group(s[m], norm_by_std=False))
    valid = outcome_advantage(
        inputs, lambda s, m: torch.full((len(m),), float(len(m) > 1 and bool(s[m].std() > 0)))
    )
    reps = sorted(set(session_representatives(len(inputs.group_ids), inputs.session_ids)))
    alpha = len(reps) / max(1.0, float(valid[reps].sum()))
    adv = broadcast_to_tokens(alpha * per_sample, inputs.response_mask)
    return adv, adv


def compute_reinforce_plus_plus_baseline_advantage(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025): subtract the group mean, then whiten over the whole batch."""
    centred = outcome_advantage(inputs, lambda s, m: _grpo_group(s[m], norm_by_std=False))
    token_adv = broadcast_to_tokens(centred, inputs.response_mask)
    adv = masked_whiten(token_adv, inputs.response_mask)
    return adv, adv
