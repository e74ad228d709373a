"""Which prompt groups carry gradient (R-7.3), scored on the reward pool when not yet scored.

Both replay buffers filter groups before training (DAPO dynamic sampling); the reward phase
would score the same trajectories later anyway, so scoring here only moves that work earlier
(the reward phase rewrites the same values).
"""

from __future__ import annotations

from typing import Any

from rl_train.algorithms.group_filter import classify_groups
from rl_train.storage.handles import call


def trajectory_keys(groups: list[str], n: int) -> list[str]:
    return [f"{g}/{j}" for g in groups for j in range(n)]


def groups_with_gradient(
    tq: Any, rewards: list[Any], partition: str, groups: list[str], n: int
) -> dict[str, bool]:
    """group -> has gradient, scoring unscored trajectories on ``rewards`` (spread across them)."""
    if not groups:
        return {}
    keys = trajectory_keys(groups, n)
    records = call(tq, "get", partition, keys)
    if any("reward" not in r for r in records):
        if not rewards:
            raise ValueError("the group filter needs rewards: give the buffer the reward pool")
        shards = [keys[i :: len(rewards)] for i in range(len(rewards))]
        for worker, shard in zip(rewards, shards, strict=True):
            if shard:
                call(worker, "score", partition, shard)
        records = call(tq, "get", partition, keys)
    verdict = classify_groups(
        [float(r["reward"]) for r in records],
        [r["group_id"] for r in records],
        [bool(r.get("is_infra", False)) for r in records],
    )
    return {g: verdict.get(g, False) for g in groups}
