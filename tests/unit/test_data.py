"""Datasets: built-in tasks, validation with file/row/column, resumable prompt loader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_train.storage.builtin_data import write_builtin_task
from rl_train.storage.dataset import DatasetError, PromptLoader, load_prompts


def test_builtin_tasks_have_correct_answers(tmp_path: Path) -> None:
    train, val = write_builtin_task("single_digit_sum", tmp_path / "s")
    rows = load_prompts([train])
    assert len(load_prompts([val])) == 100
    for row in rows[:50]:
        a, b = row["prompt"].rstrip("=").split("+")
        assert int(row["ground_truth"]) == int(a) + int(b) and int(a) < 10 and int(b) < 10
    train2, val2 = write_builtin_task("multi_digit_sum", tmp_path / "m")
    train_prompts = {r["prompt"] for r in load_prompts([train2])}
    assert not train_prompts & {r["prompt"] for r in load_prompts([val2])}


def test_malformed_rows_are_reported_with_file_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    rows = [
        {"prompt": "1+1=", "data_source": "arith", "ground_truth": "2"},
        {"prompt": "2+2=", "data_source": "arith"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DatasetError, match=r"bad.jsonl:row 2: column 'ground_truth' is missing"):
        load_prompts([path])
    parquet = tmp_path / "bad.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "", "data_source": "arith", "ground_truth": "1"}]), parquet
    )
    with pytest.raises(DatasetError, match=r"bad.parquet:row 1: column 'prompt' must be a non-empty string"):
        load_prompts([parquet])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", \n')
    with pytest.raises(DatasetError, match="broken.jsonl:row 1: not valid JSON"):
        load_prompts([broken])
    with pytest.raises(DatasetError, match="unsupported dataset format"):
        load_prompts([tmp_path / "x.csv"]) if (tmp_path / "x.csv").write_text("a") else None


def test_extra_columns_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(
        json.dumps({"prompt": "1+1=", "data_source": "arith", "ground_truth": 2, "difficulty": 3})
    )
    assert load_prompts([path]) == [
        {"prompt": "1+1=", "data_source": "arith", "ground_truth": "2", "difficulty": 3}
    ]


def test_loader_resumes_at_its_position() -> None:
    prompts = [{"prompt": str(i)} for i in range(5)]
    first = PromptLoader(prompts, seed=1)
    seen = [row["prompt"] for _, row in first.take(8)]
    assert sorted(seen[:5]) == [str(i) for i in range(5)]  # one epoch visits each prompt once
    resumed = PromptLoader(prompts, seed=1, position=3)
    assert [row["prompt"] for _, row in resumed.take(5)] == seen[3:8]
