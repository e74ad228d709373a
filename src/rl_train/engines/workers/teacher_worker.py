"""A teacher worker: holds the teacher model and writes its scores on trajectories (R-4.10).

It reads what the teacher sees of each trajectory (its token ids and their versions), scores
them (``engines/teacher/scoring.py``) and writes the teacher fields back on the records. Scoring
is idempotent: a trajectory whose scores are there for its current tokens is left as it is, so
a phase retried after a worker died scores only what the dead one had not written. The worker
holds no state but the model: Ray restarts one that dies (``TEACHER_MAX_RESTARTS``), and the
restarted one loads the model again.

The teacher's tokenizer is checked against the student's when the worker starts: the pools wait
for it (``ping``), so a mismatch stops the run before its first step, with both paths named.
On a GPU colocated with a rollout replica, the model is loaded for each scoring and dropped
after (the replica has the memory meanwhile), as a colocated reward model sleeps (R-6.8).

With ``teacher.streaming`` it also scores in the background, under the reward pool's streaming
rules (``reward_stream``): rollout replicas hand it the prompt groups it owns as they finish
(``submit``), and a thread scores the finished ones (``score_groups``), never a partial
trajectory. The ``teacher`` phase (``score``) claims its groups first, so that no group is scored
twice here at once, and then finds scored what the background wrote (``needs_scoring``). A
worker that dies loses its queue: the phase scores what is missing. One lock serialises the
model's use (and a colocated model's load and drop) between the phase and the thread.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import ray

from rl_train.algorithms.teacher_fields import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS
from rl_train.engines.teacher.config import TEACHER_SCORED_VERSIONS, TeacherConfig, check_teacher_path
from rl_train.engines.workers.named_actor import resolve_actor
from rl_train.engines.workers.placement import check_device
from rl_train.engines.workers.reward_stream import ScoringQueue
from rl_train.storage.group_scoring import trajectory_keys

if TYPE_CHECKING:
    import torch

READ_FIELDS = ["prompt_ids", "response_ids"]
OPTIONAL_READ_FIELDS = ["token_versions", TEACHER_LOG_PROBS, TEACHER_TOPK_IDS, TEACHER_SCORED_VERSIONS]
"""What the teacher reads of a trajectory: its tokens, and whether its scores are there already."""


class TeacherWorker:
    def __init__(self, student_path: str, tq: Any, teacher: dict[str, Any]) -> None:
        """``teacher``: the run's ``teacher`` section (dumped); ``student_path``: ``model.path``,
        whose tokenizer the teacher's must be."""
        import torch

        from rl_train.engines.model.tokenizer import load_tokenizer
        from rl_train.engines.teacher.same_tokenizer import check_same_tokenizer

        self.cfg = TeacherConfig.model_validate(teacher)
        assert self.cfg.path is not None, "a teacher worker needs teacher.path"
        check_teacher_path(self.cfg)  # on this worker's node
        check_device(self.cfg.device, "teacher.device")
        torch.set_num_threads(self.cfg.num_threads)
        self.device = torch.device("cuda" if self.cfg.device == "cuda" else "cpu")
        self.tokenizer = load_tokenizer(self.cfg.path)
        check_same_tokenizer(self.tokenizer, load_tokenizer(student_path), self.cfg.path, student_path)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        self.lends_memory = self.cfg.device == "cuda" and self.cfg.placement == "colocate"
        self._model: torch.nn.Module | None = None
        self._model_use = threading.Lock()
        """The phase and the background thread take turns with the model (and its load and drop)."""
        self.max_positions = 0
        self._load()
        if self.lends_memory:
            self._drop()
        self.tq = resolve_actor(tq)
        self.stream = ScoringQueue(self.score_groups, name="teacher")  # one thread: one model
        self.streamed_trajectories = 0
        """Trajectories scored in the background so far."""
        self._reported_groups = 0
        """``stream.scored_groups`` at the last ``score``: what it reports is the difference."""

    def _load(self) -> torch.nn.Module:
        from rl_train.engines.model.loading import load_policy

        if self._model is None:
            model, _ = load_policy(self.cfg.path or "", impl=self.cfg.impl)
            self._model = model.to(self.device).eval()
            config = getattr(model, "config", None)
            self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        return self._model

    def _drop(self) -> None:
        import torch

        self._model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def ping(self) -> bool:
        """The worker is up: its model loaded and its tokenizer checked."""
        return True

    # -- streaming (``teacher.streaming``) -----------------------------------------------
    def submit(self, partition: str, groups: list[str], n: int, *after: Any) -> int:
        """Queue finished groups to score in the background and return at once (``after``: the
        queue writes that finished them, resolved by Ray before this runs). Returns how many
        were new here (a group queued or being scored already is ignored)."""
        return self.stream.submit(partition, groups, n)

    def score_groups(self, partition: str, groups: list[str], n: int) -> int:
        """Score the trajectories of the groups that are finished (never a partial one) and
        lack the teacher's scores of their tokens, and write them (``update``: a group evicted
        meanwhile is not brought back). Returns how many groups it scored."""
        finished = set(ray.get(self.tq.query.remote(partition, kind="prompt", status="finished")))
        keys, records = self._read_groups(partition, [g for g in groups if g in finished], n)
        scored, _ = self._score_and_write(partition, keys, records)
        self.streamed_trajectories += len(scored)
        return len({key.rsplit("/", 1)[0] for key in scored})

    def _read_groups(self, partition: str, groups: list[str], n: int) -> tuple[list[str], list[dict[str, Any]]]:
        """The keys and records of ``groups``' trajectories; a group evicted since it was seen
        finished is left out (its records are gone)."""
        keys = trajectory_keys(groups, n)
        if not keys:
            return [], []
        try:
            return keys, ray.get(self.tq.get.remote(partition, keys, READ_FIELDS, OPTIONAL_READ_FIELDS))
        except KeyError:  # one group was evicted meanwhile: read the others one by one
            pass
        out_keys: list[str] = []
        out_records: list[dict[str, Any]] = []
        for group in groups:
            group_keys = trajectory_keys([group], n)
            try:
                out_records += ray.get(self.tq.get.remote(partition, group_keys, READ_FIELDS, OPTIONAL_READ_FIELDS))
            except KeyError:
                continue
            out_keys += group_keys
        return out_keys, out_records

    def streamed(self) -> dict[str, int]:
        """Groups and trajectories scored in the background so far, and the groups queued or
        being scored now."""
        return {
            "scored_groups": self.stream.scored_groups,
            "scored_trajectories": self.streamed_trajectories,
            "pending_groups": self.stream.pending(),
        }

    # -- the teacher phase -------------------------------------------------------------------
    def score(self, partition: str, keys: list[str]) -> dict[str, float]:
        """Write the teacher fields on each trajectory of ``keys`` that lacks them for its current
        tokens; the groups queued or being scored in the background are claimed first (``keys``:
        whole groups, each on its owner). Returns counts: ``teacher/scored`` (by this call),
        ``teacher/found_scored`` (already scored: in the background, or by an earlier call),
        ``teacher/infra``, ``teacher/streamed_groups`` (scored in the background since the last
        call), and the time spent."""
        start = time.perf_counter()
        self.stream.claim(partition, list(dict.fromkeys(key.rsplit("/", 1)[0] for key in keys)))
        records = ray.get(self.tq.get.remote(partition, keys, READ_FIELDS, OPTIONAL_READ_FIELDS)) if keys else []
        scored, infra = self._score_and_write(partition, keys, records)
        streamed = self.stream.scored_groups
        self._reported_groups, since = streamed, streamed - self._reported_groups
        return {
            "teacher/scored": float(len(scored)),
            "teacher/found_scored": float(len(keys) - len(scored)),
            "teacher/infra": float(infra),
            "teacher/streamed_groups": float(since),
            "teacher/seconds": time.perf_counter() - start,
        }

    def _score_and_write(self, partition: str, keys: list[str], records: list[dict[str, Any]]) -> tuple[list[str], int]:
        """Score the records that lack the teacher's scores of their current tokens and write
        them (``update``: a trajectory deleted meanwhile, its group evicted, is not brought
        back). Returns the keys scored and how many of them the teacher could not read."""
        from rl_train.engines.teacher.scoring import needs_scoring, score_records

        todo = [i for i, record in enumerate(records) if needs_scoring(record, self.cfg.top_k)]
        if not todo:
            return [], 0
        with self._model_use:
            model = self._load()
            try:
                fields = score_records(
                    model,
                    [records[i] for i in todo],
                    pad_id=self.pad_id,
                    temperature=self.cfg.temperature,
                    top_k=self.cfg.top_k,
                    max_positions=self.max_positions,
                    micro_batch_size=self.cfg.micro_batch_size,
                )
            finally:
                if self.lends_memory:
                    self._drop()
        ray.get(self.tq.update.remote(partition, {keys[i]: f for i, f in zip(todo, fields, strict=True)}))
        return [keys[i] for i in todo], sum(1 for f in fields if f.get("is_infra"))
