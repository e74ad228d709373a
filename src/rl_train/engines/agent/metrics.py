"""Metrics of a batch's multi-turn trajectories, under ``agent/``.

Read from the records the tool loop wrote (``agent_turns``, ``tool_calls`` as ``[name, error,
seconds]``, ``response_mask``): turns and tool calls per trajectory, calls and errors by tool,
the tool-latency percentiles, and the share of response tokens that were observations. A batch
without such records has none of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(int(-(-q * len(ordered) // 100)), 1)  # ceil(q/100 * n), at least the first
    return float(ordered[min(rank, len(ordered)) - 1])


def agent_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    agents = [r for r in records if "agent_turns" in r]
    if not agents:
        return {}
    calls = [call for r in agents for call in r.get("tool_calls") or []]
    masks = [m for r in agents for m in r.get("response_mask") or []]
    out = {
        "agent/trajectories": float(len(agents)),
        "agent/turns_mean": sum(float(r["agent_turns"]) for r in agents) / len(agents),
        "agent/tool_calls_mean": len(calls) / len(agents),
        "agent/tool_errors_mean": sum(1 for c in calls if c[1]) / len(agents),
        "agent/observation_token_frac": (masks.count(0) / len(masks)) if masks else 0.0,
    }
    for name in sorted({str(c[0]) for c in calls}):
        mine = [c for c in calls if c[0] == name]
        out[f"agent/tool_calls/{name}"] = float(len(mine))
        out[f"agent/tool_errors/{name}"] = float(sum(1 for c in mine if c[1]))
    latencies = [float(c[2]) for c in calls if c[0] != "<malformed>"]
    for q in PERCENTILES if latencies else ():
        out[f"agent/tool_latency_p{q}_s"] = percentile(latencies, q)
    return out
