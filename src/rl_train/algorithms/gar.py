"""Groupwise advantage redistribution (GAR, R-6.6), a pure function on one prompt group.

Steps, for one group of n trajectories:
1. Confirmed reward hackers get effective reward 0 and count as failing; the group statistics
   (GRPO mean / unbiased std) are recomputed on the effective rewards.
2. Let P be the set of passing trajectories with positive advantage. Each is down-weighted by
   its quality f_i in (0, 1], and the positive mass removed is handed back through one common
   factor c applied to all of P: A'_i = c * f_i * A_i with c = sum_P A_i / sum_P f_i A_i.
   Hence sum_P A'_i = sum_P A_i: the group's total positive advantage is unchanged, and among
   passers the high-quality ones (f = 1) gain at the expense of the low-quality ones.
3. Every other trajectory (failing, or with a non-positive advantage) keeps its advantage.

``redistribute_group_advantages`` is the whole of it on one group with GRPO's statistics (the
oracle of the tests). In a run (``reshape_batch``, called by the advantage phase when
``reward.gar`` is set) step 1 zeroes the hackers' scores before the configured outcome
estimator runs, so any group baseline is recomputed, and step 2 rescales the estimator's
per-sample advantages; with ``grpo`` the two are the same computation. Only groups with a
grader verdict (``GarGrades.graded``) are touched: a group whose grader failed, or that was
never graded, keeps the estimator's advantages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

EPSILON = 1e-6


@dataclass(frozen=True)
class GarGrades:
    """A batch's grader verdicts, one entry per trajectory (all [B])."""

    graded: torch.Tensor
    """bool: the trajectory's group has a verdict (its grader ran and did not fail) and the
    trajectory has a real score (not ``is_infra``)."""
    quality: torch.Tensor
    """float in (0, 1]; 1 where not graded."""
    hacked: torch.Tensor
    """bool: flagged as reward hacking (False where not graded)."""
    passed: torch.Tensor
    """bool: its task's reward reached the pass threshold."""

    def effective_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Step 1: a confirmed hacker's score is 0, before any group statistic is taken."""
        return torch.where(self.graded & self.hacked, torch.zeros_like(scores), scores)


def grades_from_records(records: Sequence[Mapping[str, Any]], pass_threshold: float) -> tuple[GarGrades, int]:
    """The verdicts the records carry, and how many groups' graders failed. The reward worker
    writes on each trajectory of a graded group ``gar_quality``, ``gar_hacking`` and
    ``gar_infra`` (why its grader failed; "" when it gave a verdict)."""
    infra = torch.tensor([bool(r.get("is_infra", False)) for r in records], dtype=torch.bool)
    has_verdict = torch.tensor(
        [r.get("gar_quality") is not None and not r.get("gar_infra") for r in records], dtype=torch.bool
    )
    graded = has_verdict & ~infra
    quality = torch.tensor([float(r.get("gar_quality") or 1.0) for r in records])
    hacked = torch.tensor([bool(r.get("gar_hacking", False)) for r in records], dtype=torch.bool)
    passed = torch.tensor([float(r["reward"]) >= pass_threshold for r in records], dtype=torch.bool)
    grades = GarGrades(
        graded, torch.where(graded, quality, torch.ones_like(quality)), graded & hacked, passed & ~infra
    )
    failed = {r["group_id"] for r in records if r.get("gar_infra")}
    return grades, len(failed)


def redistribution_factors(
    advantages: torch.Tensor, passed: torch.Tensor, quality: torch.Tensor, hacked: torch.Tensor
) -> torch.Tensor:
    """Step 2 on one group's per-sample advantages [n]: the factor [n] each is multiplied by
    (c * f_i for the passing non-hackers with a positive advantage, 1 for the others)."""
    receivers = passed.bool() & ~hacked.bool() & (advantages > 0)
    weighted = quality.to(advantages.dtype) * advantages
    weighted_mass = weighted[receivers].sum()
    if weighted_mass <= 0:
        return torch.ones_like(advantages)
    scale = advantages[receivers].sum() / weighted_mass
    return torch.where(receivers, scale * quality.to(advantages.dtype), torch.ones_like(advantages))


def reshape_batch(
    advantages: torch.Tensor, response_mask: torch.Tensor, group_ids: Sequence[str], grades: GarGrades
) -> tuple[torch.Tensor, int]:
    """Step 2 on a batch's [B, T] advantages (an outcome estimator's: one value per sample over
    its response tokens), group by group where ``grades.graded``; -> (advantages, number of
    groups whose advantages changed or that had a hacker)."""
    mask = response_mask.to(advantages.dtype)
    per_sample = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    factors = torch.ones_like(per_sample)
    members: dict[str, list[int]] = {}
    for i, group in enumerate(group_ids):
        if bool(grades.graded[i]):
            members.setdefault(group, []).append(i)
    reshaped = 0
    for rows in members.values():
        index = torch.tensor(rows, dtype=torch.long)
        group_factors = redistribution_factors(
            per_sample[index], grades.passed[index], grades.quality[index], grades.hacked[index]
        )
        factors[index] = group_factors
        reshaped += int(bool((group_factors != 1).any()) or bool(grades.hacked[index].any()))
    return advantages * factors.unsqueeze(-1), reshaped


def redistribute_group_advantages(
    rewards: torch.Tensor,
    passed: torch.Tensor,
    quality: torch.Tensor,
    hacked: torch.Tensor,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """All [n] (one group): rewards, passed (bool), quality f in (0, 1], hacked (bool) -> advantages [n]."""
    if bool(((quality <= 0) | (quality > 1)).any()):
        raise ValueError("GAR quality factors must lie in (0, 1]")
    hacked = hacked.bool()
    effective = torch.where(hacked, torch.zeros_like(rewards), rewards)
    advantages = _group_advantages(effective, norm_by_std)
    return advantages * redistribution_factors(advantages, passed, quality, hacked)


def _group_advantages(rewards: torch.Tensor, norm_by_std: bool) -> torch.Tensor:
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    return centred / (rewards.std(unbiased=True) + EPSILON) if norm_by_std else centred
