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
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray

from rl_train.algorithms.teacher_fields import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS
from rl_train.engines.teacher.config import TeacherConfig, check_teacher_path
from rl_train.engines.teacher.scoring import TEACHER_SCORED_VERSIONS
from rl_train.engines.workers.named_actor import resolve_actor
from rl_train.engines.workers.placement import check_device

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
        self.max_positions = 0
        self._load()
        if self.lends_memory:
            self._drop()
        self.tq = resolve_actor(tq)

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

    def score(self, partition: str, keys: list[str]) -> dict[str, float]:
        """Write the teacher fields on each trajectory of ``keys`` that lacks them for its current
        tokens; returns counts (``teacher/scored``, ``teacher/infra``) and the time spent."""
        from rl_train.engines.teacher.scoring import needs_scoring, score_records

        start = time.perf_counter()
        records = ray.get(self.tq.get.remote(partition, keys, READ_FIELDS, OPTIONAL_READ_FIELDS)) if keys else []
        todo = [i for i, record in enumerate(records) if needs_scoring(record, self.cfg.top_k)]
        infra = 0
        if todo:
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
            infra = sum(1 for f in fields if f.get("is_infra"))
            # ``update``: a trajectory deleted meanwhile (its group evicted) is not brought back
            ray.get(self.tq.update.remote(partition, {keys[i]: f for i, f in zip(todo, fields, strict=True)}))
        return {
            "teacher/scored": float(len(todo)),
            "teacher/infra": float(infra),
            "teacher/seconds": time.perf_counter() - start,
        }
