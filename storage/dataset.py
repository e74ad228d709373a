"""Prompt datasets: Parquet or JSONL files with ``prompt``, ``data_source`` and ``ground_truth``.

Extra columns are kept and travel with the prompt. Every row is checked before a run
starts; a bad row is reported as ``file:row N: column 'x': problem``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("prompt", "data_source", "ground_truth")


class DatasetError(ValueError):
    """A dataset file is missing, unreadable or has a malformed row."""


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file")
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:row {line_no}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise DatasetError(
                        f"{path}:row {line_no}: expected a JSON object, got {type(row).__name__}"
                    )
                rows.append(row)
        return rows
    raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r}; use .parquet or .jsonl")


def validate_row(row: dict[str, Any], path: Path, row_no: int) -> None:
    for column in REQUIRED_COLUMNS:
        if column not in row or row[column] is None:
            raise DatasetError(f"{path}:row {row_no}: column {column!r} is missing")
    if not isinstance(row["prompt"], str) or not row["prompt"]:
        raise DatasetError(
            f"{path}:row {row_no}: column 'prompt' must be a non-empty string, got {row['prompt']!r}"
        )
    if not isinstance(row["data_source"], str) or not row["data_source"]:
        raise DatasetError(
            f"{path}:row {row_no}: column 'data_source' must be a non-empty string, got {row['data_source']!r}"
        )
    if not isinstance(row["ground_truth"], str | int | float):
        raise DatasetError(
            f"{path}:row {row_no}: column 'ground_truth' must be a string or number, got {row['ground_truth']!r}"
        )


def load_prompts(paths: list[str | Path]) -> list[dict[str, Any]]:
    """All rows of ``paths``, validated; ``ground_truth`` normalised to a string."""
    rows: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        for row_no, row in enumerate(_read_rows(path), start=1):
            validate_row(row, path, row_no)
            rows.append({**row, "ground_truth": str(row["ground_truth"])})
    if not rows:
        raise DatasetError(f"no rows in {', '.join(map(str, paths))}")
    return rows


@dataclass
class PromptLoader:
    """Shuffled epochs over prompts, one group (prompt) at a time; resumable by ``position``."""

    prompts: list[dict[str, Any]]
    seed: int = 0
    position: int = 0
    """Prompts handed out so far, over all epochs."""
    _order: list[int] = field(default_factory=list, repr=False)
    _epoch: int = field(default=-1, repr=False)

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.prompts)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._order, self._epoch = order, epoch
        return self._order

    def next(self) -> tuple[int, dict[str, Any]]:
        """(global index, row) of the next prompt."""
        epoch, offset = divmod(self.position, len(self.prompts))
        row = self.prompts[self._order_for(epoch)[offset]]
        index = self.position
        self.position += 1
        return index, row

    def take(self, count: int) -> list[tuple[int, dict[str, Any]]]:
        return [self.next() for _ in range(count)]
