"""The DAPO group filter (R-7.3) reads only the fields it needs from the queue, and scores the
trajectories not yet scored on the reward pool, spread across its workers."""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.storage.group_scoring import groups_with_gradient, owner_of
from rl_train.storage.transfer_queue import TransferQueue

N = 2


class FieldCountingQueue(TransferQueue):
    """The queue as the filter sees it, refusing to hand out whole records (a trajectory's
    tokens and log-probs are what an actor call's reply should not carry)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields_read: set[str] = set()

    def get(
        self,
        partition: str,
        keys: list[str],
        field_names: list[str] | None = None,
        optional_fields: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        if field_names is None:
            raise AssertionError("the group filter read whole records")
        records = super().get(partition, keys, field_names, optional_fields)
        self.fields_read.update(name for record in records for name in record)
        return records


class ScoringWorker:
    """A reward worker: writes each trajectory's score, which the record's ``answer`` dictates."""

    def __init__(self, tq: TransferQueue) -> None:
        self.tq, self.calls = tq, []

    def score(self, partition: str, keys: list[str]) -> list[float]:
        self.calls.append(list(keys))
        scores = [float(r["answer"]) for r in TransferQueue.get(self.tq, partition, keys)]
        self.tq.put(partition, {k: {"reward": s} for k, s in zip(keys, scores, strict=True)})
        return scores


def _group(tq: TransferQueue, group: str, answers: list[int], scored: bool, infra: bool = False) -> None:
    records = {}
    for j, answer in enumerate(answers):
        record: dict[str, Any] = {"group_id": group, "answer": answer, "response_ids": list(range(50))}
        if scored:
            record["reward"] = float(answer)
        if infra and j == 0:
            record["is_infra"] = True
        records[f"{group}/{j}"] = record
    tq.put("train", records)


def test_scored_groups_are_classified_from_three_fields_without_scoring() -> None:
    tq = FieldCountingQueue()
    _group(tq, "a", [1, 0], scored=True)  # rewards differ: gradient
    _group(tq, "b", [1, 1], scored=True)  # all agree: none
    _group(tq, "c", [1, 0], scored=True, infra=True)  # one valid sample left: none
    assert groups_with_gradient(tq, [], "train", ["a", "b", "c"], N) == {"a": True, "b": False, "c": False}
    assert tq.fields_read == {"group_id", "reward", "is_infra"}  # never the tokens or the answer


def test_unscored_groups_are_scored_whole_on_their_owner_reward_workers_first() -> None:
    tq = FieldCountingQueue()
    _group(tq, "a", [0, 1], scored=False)
    _group(tq, "d", [0, 0], scored=False)
    _group(tq, "h", [1, 1], scored=False)
    workers = [ScoringWorker(tq), ScoringWorker(tq)]
    assert groups_with_gradient(tq, workers, "train", ["a", "d", "h"], N) == {"a": True, "d": False, "h": False}
    # each group whole on its owner (crc32 of its key modulo 2: d -> 0; a, h -> 1), the worker
    # that a rollout replica hands it to when it streams scores
    assert owner_of("d", 2) == 0 and owner_of("a", 2) == owner_of("h", 2) == 1
    assert [w.calls for w in workers] == [[["d/0", "d/1"]], [["a/0", "a/1", "h/0", "h/1"]]]
    assert tq.fields_read == {"group_id", "reward"}


def test_unscored_groups_without_a_reward_pool_fail_with_what_to_do() -> None:
    tq = FieldCountingQueue()
    _group(tq, "a", [0, 1], scored=False)
    with pytest.raises(ValueError, match="give the buffer the reward pool"):
        groups_with_gradient(tq, [], "train", ["a"], N)
