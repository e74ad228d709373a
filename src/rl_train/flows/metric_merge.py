"""A global step's metrics from its local updates' (separate_async runs several a step).

Each local update's phases report on the groups that update trained: a quarter of the global
batch when ``trainer.parameter_sync_step`` is 4. The step reports on all of them, so that its
``reward/mean`` is over the same number of trajectories in every mode. Local updates train
equal numbers of groups, so a plain mean of their means is the mean over the step.

How each key combines, by its name:

- counts (``agent/trajectories``, ``agent/tool_calls/<tool>``, ``agent/tool_errors/<tool>``,
  ``actor/nonfinite_steps``, ``actor/router_replay_tokens``, ``reward/infra_failures``,
  ``reward/infra_failures/<data_source>``, ``greedy_baseline/infra``, GAR's ``gar/*`` and the
  teacher's ``teacher/scored``, ``teacher/found_scored``, ``teacher/infra`` and
  ``teacher/streamed_groups``) add up;
- extremes (``.../max``, ``..._max``; ``.../min``, ``..._min``) take the step's extreme;
- states that only the end of the step tells (``actor/lr``, ``critic/lr``,
  ``actor/nonfinite_steps_in_row``) take the last update's value;
- everything else (means, fractions, losses, ratios, and the tool latency percentiles, whose
  mean over equal shares is an estimate) is averaged over the updates that reported it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean

SUMMED_PREFIXES = ("agent/tool_calls/", "agent/tool_errors/", "reward/infra_failures/", "gar/")
SUMMED = frozenset(
    {
        "agent/trajectories",
        "actor/nonfinite_steps",
        "actor/router_replay_tokens",
        "reward/infra_failures",
        "greedy_baseline/infra",
        "teacher/scored",
        "teacher/found_scored",
        "teacher/infra",
        "teacher/streamed_groups",
    }
)
LAST = frozenset({"actor/lr", "critic/lr", "actor/nonfinite_steps_in_row"})


def combiner(key: str) -> Callable[[Sequence[float]], float]:
    """How the local updates' values of ``key`` make the step's."""
    if key in LAST:
        return lambda values: values[-1]
    if key in SUMMED or key.startswith(SUMMED_PREFIXES):
        return sum
    if key.endswith(("/max", "_max")):
        return max
    if key.endswith(("/min", "_min")):
        return min
    return fmean


def merge_local_updates(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """One metrics dict for the step; keys keep the order they first appeared in."""
    if len(parts) == 1:
        return dict(parts[0])
    values: dict[str, list[float]] = {}
    for part in parts:
        for key, value in part.items():
            values.setdefault(key, []).append(value)
    return {key: combiner(key)(seen) for key, seen in values.items()}
