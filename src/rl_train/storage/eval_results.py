"""Evaluation results of a run, kept beside its checkpoints (R-10.1).

    <checkpoint root>/eval/step-00000012.json   <- one document per evaluated step
    <checkpoint root>/eval/history.jsonl         <- one row per (step, dataset) evaluation

The checkpoint store ignores every folder not named ``step-<8 digits>`` (it neither lists nor
prunes ``eval/``), and an evaluation writes nothing anywhere else: a training run committing
checkpoints at the same time never sees it. Both files are replaced whole, under their final
name, at once (a renamed temporary file on local disk, one PUT on S3), so a reader never sees
half a document. ``history.jsonl`` is therefore rewritten rather than appended to (S3 has no
append); one evaluation of a run writes at a time (the eval deployment allows one run at once).
"""

from __future__ import annotations

import json
from typing import Any

from rl_train.storage.checkpoint import step_dir_name
from rl_train.storage.checkpoint_io import build_publisher, open_filesystem

EVAL_DIR = "eval"
HISTORY_FILE = "history.jsonl"


class EvalResults:
    """The ``eval/`` folder under a checkpoint root (a local path or ``s3://`` URI)."""

    def __init__(self, checkpoint_root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = f"{checkpoint_root.rstrip('/')}/{EVAL_DIR}"
        self.fs, self._root = open_filesystem(self.uri, storage_options)
        self._publisher = build_publisher(self.fs)

    def step_uri(self, step: int) -> str:
        return f"{self.uri}/{step_dir_name(step)}.json"

    @property
    def history_uri(self) -> str:
        return f"{self.uri}/{HISTORY_FILE}"

    def _read(self, name: str) -> bytes | None:
        path = f"{self._root}/{name}"
        self.fs.invalidate_cache(path)
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    def _replace(self, name: str, data: bytes) -> None:
        with self._publisher.open(f"{self._root}/{name}") as handle:
            handle.write(data)

    def read_step(self, step: int) -> dict[str, Any] | None:
        """The document of ``step``, or None when it was never evaluated."""
        data = self._read(f"{step_dir_name(step)}.json")
        return None if data is None else json.loads(data)

    def write_step(self, step: int, document: dict[str, Any]) -> None:
        """Strict JSON (a NaN reward is refused, not written as a bare token)."""
        self._replace(f"{step_dir_name(step)}.json", json.dumps(document, indent=1, allow_nan=False).encode())

    def history(self) -> list[dict[str, Any]]:
        """Every row of ``history.jsonl`` in the order written."""
        data = self._read(HISTORY_FILE) or b""
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]

    def append_history(self, rows: list[dict[str, Any]]) -> None:
        earlier = self._read(HISTORY_FILE) or b""
        if earlier and not earlier.endswith(b"\n"):
            earlier += b"\n"
        added = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows).encode()
        self._replace(HISTORY_FILE, earlier + added)


def latest_rewards(history: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """dataset -> step -> reward of its latest evaluation (a forced re-run replaces the earlier)."""
    curves: dict[str, dict[int, float]] = {}
    for row in history:
        curves.setdefault(row["dataset"], {})[int(row["step"])] = float(row["reward"])
    return {name: dict(sorted(points.items())) for name, points in curves.items()}
