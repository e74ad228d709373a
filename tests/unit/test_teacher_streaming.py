"""Streaming teacher scores (``teacher.streaming``) without Ray: a real teacher worker over an
in-process queue scores finished groups in the background, never a partial one nor an evicted
one, and the teacher phase claims its groups, so that no group is scored twice and the model is
used by one thread at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import rl_train.engines.teacher.scoring as scoring
import rl_train.engines.workers.teacher_worker as teacher_worker
from rl_train.algorithms.teacher_fields import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS
from rl_train.config import load_config
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.teacher.config import TeacherConfig
from rl_train.engines.workers.reward_stream import ScoreHandoff
from rl_train.engines.workers.teacher_worker import TeacherWorker
from rl_train.storage.group_scoring import owner_of
from rl_train.storage.transfer_queue import TransferQueue

N = 2


class InProcess:
    """An actor handle over a local object: ``handle.method.remote(...)`` calls it at once (with
    ``ray.get`` the identity in the worker's module, the value is the reply)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self.target, name))


def _wait_for(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


def _put_group(tq: TransferQueue, tokenizer: Any, group: str, status: str) -> None:
    prompt = tokenizer.encode("3+4=", add_special_tokens=False)
    response = tokenizer.encode("7", add_special_tokens=False) + [tokenizer.eos_token_id]
    records = {
        f"{group}/{j}": {
            "group_id": group,
            "prompt_ids": prompt,
            "response_ids": response[: j + 1],
            "token_versions": [0] * (j + 1),
        }
        for j in range(N)
    }
    tq.put("train", {group: {"prompt": "3+4="}}, {group: {"kind": "prompt", "status": "pending"}})
    tq.put("train", records, {k: {"kind": "trajectory", "group_id": group} for k in records})
    for step in ("running", "finished")[: 1 + (status == "finished")]:
        tq.set_tags("train", {group: {"status": step}})


def _keys(*groups: str) -> list[str]:
    return [f"{g}/{j}" for g in groups for j in range(N)]


@pytest.fixture
def worker(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TeacherWorker, TransferQueue]:
    monkeypatch.setattr(teacher_worker, "ray", SimpleNamespace(get=lambda value: value))
    tq = TransferQueue()
    config = TeacherConfig(path=str(tiny_model_dir), top_k=3, streaming=True)
    return TeacherWorker(str(tiny_model_dir), InProcess(tq), config.model_dump(mode="json")), tq


class GatedScoring:
    """``score_records`` that waits for the test's gate on its first call, and records every
    call's trajectories and how many ran at once (the edge: the model's use)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = scoring.score_records
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(scoring, "score_records", self)

    def __call__(self, model: Any, records: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            first = not self.calls
            self.calls.append(len(records))
        self.started.set()
        if first:
            assert self.gate.wait(20.0)
        try:
            return self.real(model, records, **options)
        finally:
            with self._lock:
                self.running -= 1


def test_only_finished_groups_are_scored_in_the_background(worker: tuple[TeacherWorker, TransferQueue]) -> None:
    teacher, tq = worker
    tokenizer = load_tokenizer(teacher.cfg.path or "")
    _put_group(tq, tokenizer, "p0", "finished")
    _put_group(tq, tokenizer, "p1", "running")  # a partial rollout: never scored in the background
    assert teacher.submit("train", ["p0", "p1"], N) == 2
    _wait_for(lambda: teacher.streamed()["pending_groups"] == 0)
    assert teacher.streamed() == {"scored_groups": 1, "scored_trajectories": N, "pending_groups": 0}
    scored = tq.get("train", _keys("p0"))
    assert all(len(r[TEACHER_LOG_PROBS]) == len(r["response_ids"]) and len(r[TEACHER_TOPK_IDS][0]) == 3 for r in scored)
    assert all(TEACHER_LOG_PROBS not in r for r in tq.get("train", _keys("p1")))

    # the phase finds p0 scored, scores p1 itself, and writes what the background would have
    tq.set_tags("train", {"p1": {"status": "finished"}})
    metrics = teacher.score("train", _keys("p0", "p1"))
    assert metrics["teacher/scored"] == N and metrics["teacher/found_scored"] == N
    assert metrics["teacher/streamed_groups"] == 1 and metrics["teacher/infra"] == 0
    records = tq.get("train", _keys("p0", "p1"))
    options = {"pad_id": teacher.pad_id, "temperature": 1.0, "top_k": 3, "max_positions": teacher.max_positions}
    direct = scoring.score_records(teacher._load(), records, micro_batch_size=64, **options)
    for record, fields in zip(records, direct, strict=True):
        assert record[TEACHER_LOG_PROBS] == pytest.approx(fields[TEACHER_LOG_PROBS], abs=1e-5)
    # nothing new in the background since: the next phase reports none
    assert teacher.score("train", _keys("p0", "p1"))["teacher/streamed_groups"] == 0


def test_a_group_evicted_meanwhile_is_not_brought_back(worker: tuple[TeacherWorker, TransferQueue]) -> None:
    teacher, tq = worker
    tokenizer = load_tokenizer(teacher.cfg.path or "")
    for group in ("p0", "p1", "p2"):
        _put_group(tq, tokenizer, group, "finished")
    tq.delete("train", _keys("p1"))  # its records evicted after it was seen finished: the others are scored
    read = tq.get

    def get_then_evict(partition: str, keys: list[str], *fields: Any) -> list[dict[str, Any]]:
        records = read(partition, keys, *fields)
        if "p2/0" in keys:  # evicted while the teacher scores it
            tq.delete(partition, ["p2", *_keys("p2")])
        return records

    tq.get = get_then_evict  # type: ignore[method-assign]
    assert teacher.score_groups("train", ["p0", "p1"], N) == 1
    assert teacher.score_groups("train", ["p2"], N) == 1  # scored, its write skipped
    assert tq.query("train", kind="prompt") == ["p0", "p1"] and tq.count("train") == 2 + N  # no record made
    assert all(TEACHER_LOG_PROBS in r for r in read("train", _keys("p0")))


def test_the_phase_claims_its_groups_and_shares_the_model_with_the_background(
    worker: tuple[TeacherWorker, TransferQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    teacher, tq = worker
    teacher.lends_memory = True  # a colocated teacher: loaded for each scoring, dropped after
    tokenizer = load_tokenizer(teacher.cfg.path or "")
    for group in ("p0", "p1", "p2"):
        _put_group(tq, tokenizer, group, "finished")
    gated = GatedScoring(monkeypatch)
    teacher.submit("train", ["p0"], N)
    assert gated.started.wait(20.0)  # p0 is being scored in the background
    teacher.submit("train", ["p1"], N)  # queued behind it
    found: dict[str, float] = {}
    phase = threading.Thread(target=lambda: found.update(teacher.score("train", _keys("p0", "p1", "p2"))))
    phase.start()
    time.sleep(0.2)
    assert not found  # it waits for p0's write
    gated.gate.set()
    phase.join(30.0)
    assert found["teacher/scored"] == 2 * N and found["teacher/found_scored"] == N  # p1 claimed, p0 read back
    _wait_for(lambda: teacher.streamed()["pending_groups"] == 0)
    assert gated.calls == [N, 2 * N]  # every trajectory scored once
    assert gated.most_at_once == 1 and teacher._model is None  # one user at a time; dropped after


def test_each_pool_gets_its_own_owners_of_the_groups() -> None:
    """The reward and the teacher hand-offs of one replica shard the same groups over their own
    pools' sizes, never one over the other's."""

    class Recorder:
        def __init__(self) -> None:
            self.got: list[str] = []
            self.submit = SimpleNamespace(remote=lambda partition, groups, n, *after: self.got.extend(groups))

    rewards, teachers = [Recorder() for _ in range(2)], [Recorder() for _ in range(3)]
    groups = [f"p{i}" for i in range(24)]
    ScoreHandoff(rewards).hand_off("train", groups, N)  # type: ignore[arg-type]
    ScoreHandoff(teachers, pool="teacher").hand_off("train", groups, N)  # type: ignore[arg-type]
    ScoreHandoff(teachers, pool="teacher").hand_off("val", groups, N)  # type: ignore[arg-type]
    for pool in (rewards, teachers):
        assert [r.got for r in pool] == [[g for g in groups if owner_of(g, len(pool)) == i] for i in range(len(pool))]


def test_teacher_streaming_is_on_by_default_in_the_async_modes_only() -> None:
    assert not load_config(overrides=["trainer.mode=sync"]).teacher.streaming
    for mode in ("colocate_async", "separate_async"):
        assert load_config(overrides=[f"trainer.mode={mode}"]).teacher.streaming
    assert not load_config(overrides=["trainer.mode=colocate_async", "teacher.streaming=false"]).teacher.streaming
