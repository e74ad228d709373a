"""Balancing a batch across DP ranks by token count (R-3.1 step 3)."""

from __future__ import annotations


def partition_by_tokens(keys: list[str], lengths: list[int], num_ranks: int) -> list[list[str]]:
    """Longest-first greedy: each sample goes to the rank with the fewest tokens so far.

    Ties go to the rank with fewer samples, so equal-length samples spread evenly. Keys keep
    their batch order within a rank (the order groups were sampled in).
    """
    order = sorted(range(len(keys)), key=lambda i: -lengths[i])
    loads = [0] * num_ranks
    members: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in order:
        rank = min(range(num_ranks), key=lambda r: (loads[r], len(members[r])))
        loads[rank] += lengths[i]
        members[rank].append(i)
    return [[keys[i] for i in sorted(m)] for m in members]
