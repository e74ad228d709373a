"""Prompt datasets: Parquet or JSONL files with ``prompt``, ``data_source`` and ``ground_truth``.

Extra columns are kept and travel with the prompt. Every row is checked before a run
starts; a bad row is reported as ``file:row N: column 'x': problem`` (N counts Parquet rows
from 1, and is the line number in a JSONL file). ``COLUMNS_DOC`` is the user-facing schema
(printed by ``rl-train config --docs``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("prompt", "data_source", "ground_truth")

COLUMNS_DOC = """\
Dataset files (data.train_files, data.val_files): Parquet (.parquet) or JSON Lines
(.jsonl/.json, one object per line), one row per prompt. Every row is checked before a run
starts, and a bad one is reported as file:row N.
  prompt        required, non-empty string: the text the policy continues.
  data_source   required, non-empty string: routes the row to its reward, by exact name or
                by its longest prefix before a '/', in reward.by_data_source, then among the
                registered rewards ('arith/single_digit_sum' uses 'arith'), else reward.default.
  ground_truth  required, string or number (read as a string): what the reward compares
                the response with.
  agent_name    optional, string: the agent loop that answers the row (single_turn,
                tool_agent or gateway_agent), over rollout.agent.by_data_source and
                rollout.agent.default.
  any other     optional: kept with the row and carried along with its prompt; a reward
                reads it as Trajectory.extra (code_tests: its tests, column 'tests').
"""
"""The dataset columns as ``rl-train config --docs`` prints them."""


class DatasetError(ValueError):
    """A dataset file is missing, unreadable or has a malformed row."""


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(row number, row) of every row: Parquet rows count from 1, JSONL rows by line number."""
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file")
    if path.suffix == ".parquet":
        return list(enumerate(pq.read_table(path).to_pylist(), start=1))
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
                rows.append((line_no, row))
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
    agent = row.get("agent_name")
    if agent is not None and (not isinstance(agent, str) or not agent):
        raise DatasetError(f"{path}:row {row_no}: column 'agent_name' must be a non-empty string, got {agent!r}")


def load_prompts(
    paths: Sequence[str | Path],
    check_data_source: Callable[[str], object] | None = None,
    check_agent_name: Callable[[str], object] | None = None,
) -> list[dict[str, Any]]:
    """All rows of ``paths``, validated; ``ground_truth`` normalised to a string.

    ``check_data_source`` (the reward routing, given by the caller so that storage does not
    import engines) raises ``KeyError`` or ``ValueError`` for a data_source nothing can score;
    that is reported as a bad row here, not as a failed reward task mid-run. ``check_agent_name``
    does the same for a row's ``agent_name`` (the agent loops).
    """
    rows: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        for row_no, row in _read_rows(path):
            validate_row(row, path, row_no)
            if check_data_source is not None:
                try:
                    check_data_source(row["data_source"])
                except (KeyError, ValueError) as exc:
                    raise DatasetError(f"{path}:row {row_no}: column 'data_source': {exc}") from None
            if check_agent_name is not None and row.get("agent_name") is not None:
                try:
                    check_agent_name(row["agent_name"])
                except (KeyError, ValueError) as exc:
                    raise DatasetError(f"{path}:row {row_no}: column 'agent_name': {exc}") from None
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
