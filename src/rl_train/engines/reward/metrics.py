"""What the reward phase reports of its results (``metrics.jsonl``).

``reward/mean`` and ``reward/max`` are over the samples with a verdict: an infra failure has
no score to count (R-6.5). ``reward/infra_failures`` counts the samples left without one
(and ``reward/infra_failures/<data_source>`` each source that had any); the step's value is
the sum over its local updates (``flows/metric_merge.py``). Each sub-score a reward returns
is averaged per data source as ``reward/<data_source>/<name>``. With ``reward.streaming``,
``reward/streamed`` is the fraction of the batch scored in the background before the phase
(the rest it scored itself: scores that came late, or were lost with a reward worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from rl_train.engines.reward.base import RewardResult

INFRA_FAILURES = "reward/infra_failures"


@dataclass(frozen=True)
class ScoredSample:
    """One scored trajectory as the reward workers report it to the reward phase."""

    data_source: str
    result: RewardResult
    streamed: bool = False
    """Scored in the background as its group finished (``reward.streaming``), read back here."""

    @property
    def score(self) -> float:
        return self.result.score


def reward_metrics(samples: Sequence[ScoredSample]) -> dict[str, float]:
    """The reward phase's metrics (see the module docstring)."""
    real = [s for s in samples if not s.result.is_infra]
    scores = [s.result.score for s in real]
    metrics = {
        "reward/mean": sum(scores) / max(len(scores), 1),
        "reward/max": max(scores, default=0.0),
        INFRA_FAILURES: float(len(samples) - len(real)),
    }
    for sample in samples:
        if sample.result.is_infra:
            key = f"{INFRA_FAILURES}/{sample.data_source}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
    subs: dict[str, list[float]] = {}
    for sample in real:
        for name, value in sample.result.sub_scores.items():
            subs.setdefault(f"reward/{sample.data_source}/{name}", []).append(value)
    metrics.update((key, fmean(values)) for key, values in subs.items())
    if any(s.streamed for s in samples):
        metrics["reward/streamed"] = sum(s.streamed for s in samples) / len(samples)
    return metrics
