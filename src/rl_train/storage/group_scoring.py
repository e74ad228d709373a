"""Which prompt groups carry gradient (R-7.3), scored on the reward pool when not yet scored.

Both replay buffers filter groups before training (DAPO dynamic sampling); the reward phase
would score the same trajectories later anyway, so scoring here only moves that work earlier
(the reward phase rewrites the same values). Only the fields the filter reads leave the queue
(group, reward, the infrastructure flag), never the trajectories' tokens and log-probs.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from rl_train.algorithms.group_filter import classify_groups
from rl_train.storage.handles import QueueStore, RewardScorer

SCORED_FIELDS = ["group_id"]
"""What every trajectory has once generated."""
OPTIONAL_SCORED_FIELDS = ["reward", "is_infra"]
"""What a trajectory has once scored (``reward``) or when infrastructure failed it (``is_infra``)."""


def trajectory_keys(groups: list[str], n: int) -> list[str]:
    return [f"{g}/{j}" for g in groups for j in range(n)]


def owner_of(group: str, num_workers: int) -> int:
    """The reward worker that scores ``group`` (whole): the same in every process (a rollout
    replica hands a finished group to it, the buffer and the reward phase ask it), so one worker
    sees every request for a group and never scores it twice (``reward.streaming``)."""
    return zlib.crc32(group.encode()) % num_workers


def groups_by_owner(groups: list[str], num_workers: int) -> list[list[str]]:
    """``groups`` split by ``owner_of``, in their order: one list per worker."""
    owned: list[list[str]] = [[] for _ in range(num_workers)]
    for group in groups:
        owned[owner_of(group, num_workers)].append(group)
    return owned


def _read(tq: QueueStore, partition: str, keys: list[str]) -> list[dict[str, Any]]:
    return tq.get(partition, keys, SCORED_FIELDS, OPTIONAL_SCORED_FIELDS)


def scored_records(
    tq: QueueStore, rewards: Sequence[RewardScorer], partition: str, groups: list[str], n: int
) -> list[dict[str, Any]]:
    """The filter's fields of every trajectory of ``groups``, scoring the groups with an
    unscored trajectory on ``rewards`` first (each group on its owner, ``owner_of``)."""
    keys = trajectory_keys(groups, n)
    records = _read(tq, partition, keys)
    unscored = list(dict.fromkeys(r["group_id"] for r in records if "reward" not in r))
    if unscored:
        if not rewards:
            raise ValueError("the group filter needs rewards: give the buffer the reward pool")
        for worker, owned in zip(rewards, groups_by_owner(unscored, len(rewards)), strict=True):
            if owned:
                worker.score(partition, trajectory_keys(owned, n))
        records = _read(tq, partition, keys)
    return records


def groups_with_gradient(
    tq: QueueStore, rewards: Sequence[RewardScorer], partition: str, groups: list[str], n: int
) -> dict[str, bool]:
    """group -> has gradient, scoring unscored trajectories on ``rewards`` (spread across them)."""
    if not groups:
        return {}
    records = scored_records(tq, rewards, partition, groups, n)
    verdict = classify_groups(
        [float(r["reward"]) for r in records],
        [r["group_id"] for r in records],
        [bool(r.get("is_infra", False)) for r in records],
    )
    return {g: verdict.get(g, False) for g in groups}


def real_score_counts(
    tq: QueueStore, rewards: Sequence[RewardScorer], partition: str, groups: list[str], n: int
) -> dict[str, int]:
    """group -> how many of its trajectories have a real score (not ``is_infra``, R-6.5)."""
    if not groups:
        return {}
    counts = dict.fromkeys(groups, 0)
    for record in scored_records(tq, rewards, partition, groups, n):
        if not record.get("is_infra", False):
            counts[record["group_id"]] += 1
    return counts
