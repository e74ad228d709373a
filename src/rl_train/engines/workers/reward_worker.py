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

With ``reward.streaming`` it also scores in the background: rollout replicas hand it the
prompt groups it owns as they finish (``submit``), and up to ``reward.max_concurrent_batches``
threads score them (``reward_stream.ScoringQueue``), tagging each group ``scored``. ``score`` (the reward phase,
the group filter) then reads those results back rather than scoring them again.
"""

from __future__ import annotations

import threading
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
from rl_train.engines.workers.placement import check_device
from rl_train.engines.workers.reward_stream import ScoringQueue
from rl_train.storage.group_scoring import trajectory_keys

RESULT_FIELDS = ["reward", "is_infra", "reward_sub_scores", "infra_reason"]
"""What a scored trajectory's record holds of its result (``result_fields``)."""


def stored_result(record: dict[str, Any]) -> RewardResult:
    """The result ``result_fields`` wrote on a record, back."""
    return RewardResult(
        float(record["reward"]),
        dict(record.get("reward_sub_scores") or {}),
        bool(record.get("is_infra", False)),
        str(record.get("infra_reason", "")),
    )


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
        config = RewardConfig.model_validate(reward or {})
        check_device(config.device, "reward.device")
        self.reader = TrajectoryReader(load_response_decoder(model_path))  # transformers only where needed
        self.eos_token_id = self.reader.eos_token_id
        self.router = RewardRouter(config, SandboxConfig.model_validate(sandbox or {}))
        self.router.build_configured()
        self.grading = GroupGrading(config.gar, group_size) if config.gar.on else None
        self.tq = resolve_actor(tq)
        self._grading = threading.Lock()
        """One group grading at a time: the background threads' and a caller's share the grader.
        The rewards are guarded by the router (``RewardRouter.exclusive``)."""
        self.stream = ScoringQueue(self.score_groups, config.max_concurrent_batches)

    # -- streaming (``reward.streaming``) ------------------------------------------------
    def submit(self, partition: str, groups: list[str], n: int, *after: Any) -> int:
        """Queue finished groups to score in the background and return at once (``after``: the
        queue writes that finished them, resolved by Ray before this runs). Returns how many
        were new here (a group queued or being scored already is ignored)."""
        return self.stream.submit(partition, groups, n)

    def score_groups(self, partition: str, groups: list[str], n: int) -> int:
        """Score the groups that are finished and not scored yet, and write their scores with
        the ``scored`` tag on each prompt (``update``: a group evicted meanwhile is skipped).
        Returns how many groups it scored."""
        finished = set(ray.get(self.tq.query.remote(partition, kind="prompt", status="finished")))
        scored = set(ray.get(self.tq.query.remote(partition, kind="prompt", scored=True)))
        todo = [g for g in groups if g in finished and g not in scored]
        if not todo:
            return 0
        keys = trajectory_keys(todo, n)
        optional = [*OPTIONAL_TRAJECTORY_FIELDS, *self._grading_fields(partition)]
        records = ray.get(self.tq.get.remote(partition, keys, TRAJECTORY_FIELDS, optional))
        rows = dict(zip(todo, ray.get(self.tq.get.remote(partition, todo)), strict=True))
        _, fields = self._score_and_grade(partition, records, rows)
        ray.get(self.tq.update.remote(partition, dict(zip(keys, fields, strict=True)), {g: {"scored": True} for g in todo}))
        return len(todo)

    def streamed(self) -> dict[str, int]:
        """Groups scored in the background so far, and those queued or being scored now."""
        return {"scored_groups": self.stream.scored_groups, "pending_groups": self.stream.pending()}

    def response_text(self, record: dict[str, Any]) -> str:
        """The model's answer (``TrajectoryReader.response_text``)."""
        return self.reader.response_text(record)

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        """Write ``reward`` and ``is_infra`` on each trajectory; returns the results in key order.

        The trajectories of a group scored in the background (tagged ``scored``) are read back,
        not scored again; a group queued or being scored here is claimed first (``keys``: whole
        groups, each on its owner, ``owner_of``)."""
        groups = list(dict.fromkeys(key.rsplit("/", 1)[0] for key in keys))
        self.stream.claim(partition, groups)
        done = set(ray.get(self.tq.query.remote(partition, kind="prompt", scored=True))).intersection(groups)
        optional = [*OPTIONAL_TRAJECTORY_FIELDS, *RESULT_FIELDS, *self._grading_fields(partition)]
        records = ray.get(self.tq.get.remote(partition, keys, TRAJECTORY_FIELDS, optional))
        todo = [i for i, r in enumerate(records) if r["group_id"] not in done]
        samples: list[ScoredSample | None] = [
            None if r["group_id"] not in done else ScoredSample(str(r["data_source"]), stored_result(r), streamed=True)
            for r in records
        ]
        if todo:
            todo_groups = list(dict.fromkeys(records[i]["group_id"] for i in todo))
            rows = dict(zip(todo_groups, ray.get(self.tq.get.remote(partition, todo_groups)), strict=True))
            scored, fields = self._score_and_grade(partition, [records[i] for i in todo], rows)
            for i, sample in zip(todo, scored, strict=True):
                samples[i] = sample
            ray.get(self.tq.put.remote(partition, {keys[i]: f for i, f in zip(todo, fields, strict=True)}))
        return [s for s in samples if s is not None]

    def _grading_fields(self, partition: str) -> list[str]:
        """What is read of an earlier scoring to grade a group once (nothing without GAR)."""
        return PREVIOUS_FIELDS if self.grading is not None and partition == GRADED_PARTITION else []

    def _score_and_grade(
        self, partition: str, records: list[dict[str, Any]], rows: dict[str, dict[str, Any]]
    ) -> tuple[list[ScoredSample], list[dict[str, Any]]]:
        """The results of ``records`` and what to write on each: the result, and with
        ``reward.gar`` on the trained partition the group grader's verdicts (after the
        per-sample scores: the grader reads them)."""
        trajectories = [self.reader.trajectory(r, rows[r["group_id"]]) for r in records]
        samples = self.score_trajectories(trajectories)
        graded: list[dict[str, Any]] = [{} for _ in records]
        if self.grading is not None and partition == GRADED_PARTITION:
            results = [s.result for s in samples]
            with self._grading:
                graded = self.grading.fields([r["group_id"] for r in records], trajectories, results, records)
        return samples, [{**result_fields(s.result), **g} for s, g in zip(samples, graded, strict=True)]

    def score_records(self, records: list[dict[str, Any]], rows: dict[str, dict[str, Any]]) -> list[ScoredSample]:
        """The results of trajectory ``records`` (their ``TRAJECTORY_FIELDS``), given their
        prompts' ``rows`` by group id; no queue involved."""
        return self.score_trajectories([self.reader.trajectory(r, rows[r["group_id"]]) for r in records])

    def score_trajectories(self, trajectories: list[Trajectory]) -> list[ScoredSample]:
        results = self.router.score(trajectories)
        return [ScoredSample(t.data_source, r) for t, r in zip(trajectories, results, strict=True)]
