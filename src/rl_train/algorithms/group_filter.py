"""DAPO dynamic-sampling group filter (R-7.3), as pure functions the replay buffers call.

A group carries gradient only if its valid (non-infra) scores differ: a group with no valid
sample, exactly one, or all valid scores equal (std 0) gives every sample zero advantage under
group-baseline estimators, so it is evicted and refilled. Infra failures (R-6.5) say nothing
about the model and are ignored, never counted as failures.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence


def classify_groups(
    scores: Sequence[float], group_ids: Sequence[str], is_infra: Sequence[bool] | None = None
) -> dict[str, bool]:
    """group id -> has_gradient, in first-seen order. ``scores[i]`` is sample i's outcome score."""
    if len(scores) != len(group_ids) or (is_infra is not None and len(is_infra) != len(scores)):
        raise ValueError(
            f"scores ({len(scores)}), group_ids ({len(group_ids)}) and is_infra must have one entry per sample"
        )
    valid: dict[str, list[float]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        valid.setdefault(gid, [])
        if is_infra is None or not is_infra[i]:
            valid[gid].append(float(scores[i]))
    return {gid: len(vals) >= 2 and max(vals) != min(vals) for gid, vals in valid.items()}


def refill_credit(num_evicted_groups: int, num_failed_groups: int = 0, refill_failed: bool = False) -> int:
    """Prompt groups to dispatch again: 2 per evicted group, plus 1 per failed group when enabled."""
    return 2 * num_evicted_groups + (num_failed_groups if refill_failed else 0)
