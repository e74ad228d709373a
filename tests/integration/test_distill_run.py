"""On-policy distillation end to end (R-4.10): a teacher pool scores every trajectory in each
trainer mode (in the async modes mostly in the background, ``teacher.streaming``), a teacher killed mid-step is restarted and the rest of its samples are scored by
the retried phase, and a teacher with another tokenizer is refused at start, by name."""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.teacher_worker import TeacherWorker
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

MARKERS = Path(tempfile.gettempdir()) / f"rlt-teacher-die-{uuid.uuid4().hex[:8]}"
atexit.register(shutil.rmtree, MARKERS, True)
GROUPS, N = 8, 4


class DyingTeacherWorker(TeacherWorker):
    """Scores half of its second call's trajectories, writes them, and dies (once per test)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def score(self, partition: str, keys: list[str]) -> dict[str, float]:
        self.calls += 1
        marker = MARKERS / "teacher"
        if partition == "train" and self.calls == 2 and not marker.exists():
            super().score(partition, keys[: len(keys) // 2])
            MARKERS.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(os.getpid()))
            os._exit(1)  # gone mid-step, as after the OOM killer
        return super().score(partition, keys)


def _config(small_run_config: dict[str, Any], mode: str, steps: int, **actor: Any) -> Config:
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode=mode, use_prefect=False, val_every_steps=0, total_steps=steps)
    data["trainer"]["train_batch_size"] = GROUPS
    data["rollout"]["n"] = N
    data["replay"] = {"max_off_policy_threshold": 100}
    data["actor"].update(actor)
    data["teacher"] = {"path": data["model"]["path"], "top_k": 4}
    apply_mode_defaults(data)
    return Config.model_validate(data)


def _fit(config: Config, classes: WorkerClasses | None = None) -> list[dict[str, Any]]:
    base = get_trainer_class(config.trainer.mode)
    trainer_cls = base if classes is None else type(f"Teacher{base.__name__}", (base,), {"worker_classes": classes})
    trainer = trainer_cls(config)
    trainer.fit()
    return read_metrics(trainer.run_dir)


@pytest.mark.parametrize(
    ("mode", "loss"),
    [("sync", "reverse_kl"), ("colocate_async", "forward_kl_topk"), ("separate_async", "distillation_ppo")],
)
def test_every_trained_trajectory_has_the_teachers_scores_in_each_mode(
    small_run_config: dict[str, Any], ray_local, mode: str, loss: str
) -> None:
    extra = {"distill_term": "forward_kl_topk"} if loss == "distillation_ppo" else {}
    config = _config(small_run_config, mode, 2, policy_loss=loss, **extra)
    assert config.teacher.streaming == (mode != "sync")  # the async modes' default
    metrics = _fit(config)
    assert [m["step"] for m in metrics] == [1, 2]
    for row in metrics:
        # every trained trajectory was scored: by the phase, or before it (in the background as
        # its group finished, with teacher.streaming); the counts add up over a step's local
        # updates (separate_async runs several)
        assert row["teacher/scored"] + row["teacher/found_scored"] == GROUPS * N, row
        assert row["teacher/infra"] == 0.0
        assert "timing/teacher" in row
        key = "distill/reverse_kl" if loss == "reverse_kl" else "distill/forward_kl_topk"
        assert key in row, sorted(row)
    if mode == "sync":
        assert all(m["teacher/scored"] == GROUPS * N and m["teacher/streamed_groups"] == 0 for m in metrics)
    else:  # the phase found most of each batch scored in the background already
        assert sum(m["teacher/streamed_groups"] for m in metrics) > 0, metrics
        assert sum(m["teacher/scored"] for m in metrics) < sum(m["teacher/found_scored"] for m in metrics), [
            (m["teacher/scored"], m["teacher/found_scored"]) for m in metrics
        ]


def test_a_teacher_killed_mid_step_is_restarted_and_the_rest_of_its_samples_scored(
    small_run_config: dict[str, Any], ray_local
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    for marker in MARKERS.glob("*"):
        marker.unlink()
    metrics = _fit(_config(small_run_config, "sync", 3, policy_loss="reverse_kl"), WorkerClasses(teacher=DyingTeacherWorker))
    assert (MARKERS / "teacher").exists(), "the teacher really died"
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # step 2's retry found half of the batch scored by the worker that died and scored the rest
    assert [m["teacher/scored"] for m in metrics] == [GROUPS * N, GROUPS * N / 2, GROUPS * N]
    assert all(m["teacher/infra"] == 0.0 for m in metrics)


def test_a_teacher_with_another_tokenizer_is_refused_at_start_by_name(
    small_run_config: dict[str, Any], ray_local, tmp_path: Path
) -> None:
    source = Path(small_run_config["model"]["path"])
    other = tmp_path / "other-teacher"
    shutil.copytree(source, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    config = _config(small_run_config, "sync", 1, policy_loss="reverse_kl")
    config.teacher.path = str(other)
    with pytest.raises(Exception, match="teacher.path: the tokenizer of") as error:
        _fit(config)
    assert str(other) in str(error.value) and str(source) in str(error.value)
