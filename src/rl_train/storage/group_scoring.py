"""Which prompt groups carry gradient (R-7.3), scored on the reward pool when not yet scored.

Both replay buffers filter groups before training (DAPO dynamic sampling); the reward phase
would score the same trajectories later anyway, so scoring here only moves that work earlier
(the reward phase rewrites the same values). Only the fields the filter reads leave the queue
(group, reward, the infrastructure flag; the sub-scores when ``replay.filter_groups_metric``
names one), never the trajectories' tokens and log-probs.
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
REWARD_METRIC = "reward"
"""``replay.filter_groups_metric``'s default: the score itself, not one of its sub-scores."""


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


def _read(tq: QueueStore, partition: str, keys: list[str], extra: list[str]) -> list[dict[str, Any]]:
    return tq.get(partition, keys, SCORED_FIELDS, OPTIONAL_SCORED_FIELDS + extra)


def scored_records(
    tq: QueueStore,
    rewards: Sequence[RewardScorer],
    partition: str,
    groups: list[str],
    n: int,
    extra: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The filter's fields (and the optional ``extra`` ones) of every trajectory of ``groups``,
    scoring the groups with an unscored trajectory on ``rewards`` first (each group on its
    owner, ``owner_of``)."""
    keys = trajectory_keys(groups, n)
    extra = extra or []
    records = _read(tq, partition, keys, extra)
    unscored = list(dict.fromkeys(r["group_id"] for r in records if "reward" not in r))
    if unscored:
        if not rewards:
            raise ValueError("the group filter needs rewards: give the buffer the reward pool")
        for worker, owned in zip(rewards, groups_by_owner(unscored, len(rewards)), strict=True):
            if owned:
                worker.score(partition, trajectory_keys(owned, n))
        records = _read(tq, partition, keys, extra)
    return records


def groups_with_gradient(
    tq: QueueStore,
    rewards: Sequence[RewardScorer],
    partition: str,
    groups: list[str],
    n: int,
    metric: str = REWARD_METRIC,
) -> dict[str, bool]:
    """group -> has gradient by ``metric`` (the reward, or one of its sub-scores), scoring
    unscored trajectories on ``rewards`` (spread across them)."""
    if not groups:
        return {}
    extra = [] if metric == REWARD_METRIC else ["reward_sub_scores"]
    records = scored_records(tq, rewards, partition, groups, n, extra)
    infra = [bool(r.get("is_infra", False)) for r in records]
    keys = trajectory_keys(groups, n)
    values = [
        0.0 if is_infra else _metric_value(tq, partition, key, record, metric)
        for key, record, is_infra in zip(keys, records, infra, strict=True)
    ]
    verdict = classify_groups(values, [r["group_id"] for r in records], infra)
    return {g: verdict.get(g, False) for g in groups}


def _metric_value(tq: QueueStore, partition: str, key: str, record: dict[str, Any], metric: str) -> float:
    """The value the filter judges of a scored (not infra) trajectory; a sub-score its reward
    did not return is a config error, named with the row's data_source."""
    if metric == REWARD_METRIC:
        return float(record["reward"])
    sub_scores = record.get("reward_sub_scores") or {}
    if metric not in sub_scores:
        (row,) = tq.get(partition, [record["group_id"]], [], ["data_source"])
        returned = ", ".join(sorted(sub_scores)) or "none"
        raise ValueError(
            f"replay.filter_groups_metric: {metric!r} is not a sub-score of trajectory {key!r} (data_source "
            f"{row.get('data_source', '?')!r}; its reward returned sub-scores: {returned}); name one that every "
            "data_source's reward returns, or 'reward'"
        )
    return float(sub_scores[metric])


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
