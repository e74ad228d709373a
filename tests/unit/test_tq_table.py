"""The TransferQueue as an Arrow table (R-9.2) and the resume policy for prompts in flight (R-9.3)."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from rl_train.storage.tq_table import records_to_table, requeue_in_flight, table_to_records
from rl_train.storage.transfer_queue import TransferQueue


def _queue() -> TransferQueue:
    tq = TransferQueue()
    tq.put(
        "train",
        {"p0": {"prompt": "1+2=", "ground_truth": "3", "prompt_step": 1}},
        {"p0": {"kind": "prompt", "status": "pending", "step": 1, "version": 0}},
    )
    tq.put(
        "train",
        {"p1": {"prompt": "4+4=", "ground_truth": "8", "prompt_step": 1}},
        {"p1": {"kind": "prompt", "status": "pending", "step": 1, "version": 0}},
    )
    tq.set_tags("train", {"p0": {"status": "running"}, "p1": {"status": "running"}})
    tq.set_tags("train", {"p1": {"status": "finished"}})
    trajectory = {
        "prompt_ids": [1, 5, 6],
        "response_ids": [7, 2],
        "rollout_log_probs": [-0.1 / 3, -1e-300],
        "token_versions": [0, 1],
        "stop_reason": "eos",
        "group_id": "p1",
        "extra": {"nested": [1, 2.5]},  # not typable as one Arrow column: kept as JSON
        "maybe": None,  # a present None: JSON too, so it is not confused with "absent"
    }
    tq.put(
        "train",
        {"p1/0": trajectory},
        {"p1/0": {"kind": "trajectory", "status": "eos", "group_id": "p1", "version": 0}},
    )
    tq.put(
        "train",
        {"p0/0": {**trajectory, "group_id": "p0", "stop_reason": "aborted"}},
        {"p0/0": {"kind": "trajectory", "status": "aborted", "group_id": "p0", "version": 0}},
    )
    return tq


def test_records_round_trip_exactly_through_parquet() -> None:
    rows = _queue().export_records(["train"])
    buffer = io.BytesIO()
    pq.write_table(records_to_table(rows), buffer)
    back = table_to_records(pq.read_table(io.BytesIO(buffer.getvalue())))
    assert back == rows
    for (_, _, before, _), (_, _, after, _) in zip(rows, back, strict=True):
        for name, value in before.items():
            assert type(after[name]) is type(value), name
    table = records_to_table(rows)
    assert "field:rollout_log_probs" in table.column_names  # typed: list<double>
    assert "json:extra" in table.column_names and "json:maybe" in table.column_names


def test_import_restores_the_queue_and_refuses_a_non_empty_partition() -> None:
    rows = _queue().export_records(["train"])
    fresh = TransferQueue()
    assert fresh.import_records(rows) == len(rows)
    assert fresh.export_records(["train"]) == rows
    with pytest.raises(ValueError, match="already holds"):
        fresh.import_records(rows)


def test_prompts_in_flight_go_back_to_pending_without_their_partial_trajectories() -> None:
    rows, requeued = requeue_in_flight(_queue().export_records(["train"]), version=7)
    assert requeued == ["p0"]
    by_key = {key: tags for _, key, _, tags in rows}
    assert "p0/0" not in by_key  # the partial trajectory of the running prompt is dropped
    assert by_key["p0"] == {"kind": "prompt", "status": "pending", "step": 1, "version": 7, "partial": False}
    assert by_key["p1"]["status"] == "finished" and "p1/0" in by_key  # finished groups are kept
