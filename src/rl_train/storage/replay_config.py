"""``replay.*``: the replay buffers (R-2.9, R-7.2, R-7.3, R-9.4).

The sync mode's buffer reads the DAPO filter, the failure and ``sampler`` knobs; staleness is
0 there, so the staleness, prefetch and rescue knobs belong to the async modes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_train.algorithms.config import StrictModel


class ReplayConfig(StrictModel):
    max_off_policy_threshold: int = Field(8, ge=1)
    """R-7.2 staleness limit (versions behind + 1); drop evicts finished groups above it, wait blocks at it. Mode defaults: colocate_async 2, separate_async parameter_sync_step + 1."""
    staleness_strategy: Literal["drop", "wait"] = "drop"
    """drop: evict stale finished groups and refill; wait: block sampling while an in-flight prompt is at the limit."""
    filter_groups: bool = False
    """DAPO group filter (R-7.3): evict groups whose valid scores all agree (no gradient); sync refills 2 per evicted group and discards the surplus, async refills 1."""
    filter_groups_metric: str = Field("reward", min_length=1)
    """What the DAPO filter judges a group's spread on: reward (the score trained on) or the name of a sub-score every sample's reward returns (e.g. a hybrid stack's rule component, 'exact'); a sample without it fails the step, naming its data_source."""
    max_filter_rounds: int = Field(8, ge=1)
    """sync DAPO filter: generation rounds per batch; then groups without gradient fill what is missing."""
    refill_infra_groups: bool = False
    """sync, without the DAPO filter (which evicts them already): a group left with fewer than two real scores (its other samples' graders failed, is_infra) is scored at once, evicted and replaced by a fresh prompt, for up to max_filter_rounds rounds."""
    refill_failed_groups: bool = False
    """Evict failed groups and draw fresh prompts for them (off: a failed prompt is retried as it is)."""
    max_failure_rounds: int = Field(3, ge=1)
    """sync: generation rounds in a row with a failed group before the run stops, so a broken rollout engine fails fast (async: sample_timeout_seconds bounds it)."""
    prefetch_batches: int = Field(1, ge=0)
    """Batches kept in flight beyond the one being sampled (the warm-up dispatch of the async modes)."""
    awaiting_scores_multiple: int = Field(8, ge=0)
    """With reward.streaming: finished groups waiting for their scores (or scored late and not sampled yet) free their rollout slots, up to this many times the outstanding groups (1 + prefetch_batches batches), so rollout runs ahead of a grader slower than a step: by Little's law it needs the groups rollout makes in a grader's latency, which a grader answering a batch at a time can double; 0: they hold their slots. Staleness is unchanged: a group that ages past max_off_policy_threshold while it waits is evicted."""
    sample_timeout_seconds: float = Field(300.0, gt=0)
    """Longest a sample may wait for enough finished groups before it fails."""
    poll_interval_seconds: float = Field(0.02, gt=0)
    """How often a waiting sample re-reads the TransferQueue tags."""
    rescue_after_seconds: float | None = Field(None, gt=0)
    """separate_async starvation rescue (R-2.7): after this wait the trainer's spare engine generates (None: never)."""
    sampler: str | None = None
    """Custom replay buffer class as 'package.module:ClassName' (None: the mode's own buffer, R-2.9)."""

    @model_validator(mode="after")
    def _metric_needs_the_filter(self) -> ReplayConfig:
        if self.filter_groups_metric != "reward" and not self.filter_groups:
            raise ValueError(
                f"filter_groups_metric: got {self.filter_groups_metric!r} with filter_groups false; the metric is "
                "what the DAPO filter judges: set replay.filter_groups true, or leave the metric at 'reward'"
            )
        return self
