"""A reward worker: scores trajectories by their data_source (R-6.1, R-6.2, R-6.5).

It reads only what a reward sees of each trajectory (``TRAJECTORY_FIELDS``, never log-probs or
versions) and the rows of their prompts, scores them through the run's ``RewardRouter`` and
writes back ``reward`` and ``is_infra`` (with ``reward_sub_scores`` and ``infra_reason`` where
there are any). An infra-failed sample's ``reward`` is 0.0 and means nothing: the group filter
and the advantage read ``is_infra`` and leave it out.

With ``reward.gar``, each whole prompt group of the training partition is then handed to the
group grader (``GroupGrading``), and its verdicts are written beside the rewards
(``gar_quality``, ``gar_hacking``, ``gar_infra``). This is the one place a grader is called:
the reward phase and the async modes' group filter both score through here.
"""

from __future__ import annotations

from typing import Any

import ray

from rl_train.engines.model.response_decoder import load_response_decoder
from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.gar_graders import PREVIOUS_FIELDS, GroupGrading
from rl_train.engines.reward.metrics import ScoredSample
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.reward.trajectory import OPTIONAL_TRAJECTORY_FIELDS, TRAJECTORY_FIELDS, TrajectoryReader
from rl_train.engines.sandbox import SandboxConfig
from rl_train.engines.workers.named_actor import resolve_actor

GRADED_PARTITION = "train"
"""Groupwise grading reshapes advantages: only the trained partition's groups are graded."""


def result_fields(result: RewardResult) -> dict[str, Any]:
    """What a result writes on its trajectory's record (``is_infra`` always, so that a sample
    scored again after an infra failure loses the flag)."""
    fields: dict[str, Any] = {"reward": result.score, "is_infra": result.is_infra}
    if result.sub_scores:
        fields["reward_sub_scores"] = dict(result.sub_scores)
    if result.is_infra:
        fields["infra_reason"] = result.reason
    return fields


class RewardWorker:
    def __init__(
        self,
        model_path: str,
        tq: Any,
        reward: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
        group_size: int = 1,
    ) -> None:
        """``reward`` and ``sandbox``: the run's sections (dumped), how it scores and runs code;
        ``group_size``: trajectories per prompt (a group is graded once all are scored)."""
        self.reader = TrajectoryReader(load_response_decoder(model_path))  # transformers only where needed
        self.eos_token_id = self.reader.eos_token_id
        config = RewardConfig.model_validate(reward or {})
        self.router = RewardRouter(config, SandboxConfig.model_validate(sandbox or {}))
        self.router.build_configured()
        self.grading = GroupGrading(config.gar, group_size) if config.gar.on else None
        self.tq = resolve_actor(tq)

    def response_text(self, record: dict[str, Any]) -> str:
        """The model's answer (``TrajectoryReader.response_text``)."""
        return self.reader.response_text(record)

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        """Write ``reward`` and ``is_infra`` on each trajectory; returns the results in key order."""
        grading = self.grading if partition == GRADED_PARTITION else None
        optional = OPTIONAL_TRAJECTORY_FIELDS + (PREVIOUS_FIELDS if grading else [])
        records = ray.get(self.tq.get.remote(partition, keys, TRAJECTORY_FIELDS, optional))
        groups = list(dict.fromkeys(r["group_id"] for r in records))
        rows = dict(zip(groups, ray.get(self.tq.get.remote(partition, groups)), strict=True))
        trajectories = [self.reader.trajectory(r, rows[r["group_id"]]) for r in records]
        samples = self.score_trajectories(trajectories)
        graded: list[dict[str, Any]] = [{} for _ in records]
        if grading is not None:  # after the per-sample scores: the grader reads them
            results = [s.result for s in samples]
            graded = grading.fields([r["group_id"] for r in records], trajectories, results, records)
        fields = {k: {**result_fields(s.result), **g} for k, s, g in zip(keys, samples, graded, strict=True)}
        ray.get(self.tq.put.remote(partition, fields))
        return samples

    def score_records(self, records: list[dict[str, Any]], rows: dict[str, dict[str, Any]]) -> list[ScoredSample]:
        """The results of trajectory ``records`` (their ``TRAJECTORY_FIELDS``), given their
        prompts' ``rows`` by group id; no queue involved."""
        return self.score_trajectories([self.reader.trajectory(r, rows[r["group_id"]]) for r in records])

    def score_trajectories(self, trajectories: list[Trajectory]) -> list[ScoredSample]:
        results = self.router.score(trajectories)
        return [ScoredSample(t.data_source, r) for t, r in zip(trajectories, results, strict=True)]
