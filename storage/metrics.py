"""``<run_dir>/metrics.jsonl``: one JSON object per global step, through fsspec (local or s3://)."""

from __future__ import annotations

import json
from typing import Any

import fsspec


class MetricsWriter:
    def __init__(self, run_dir: str) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(run_dir)
        self.fs.makedirs(self.root, exist_ok=True)
        self.path = f"{self.root.rstrip('/')}/metrics.jsonl"
        self._lines: list[str] = []

    def write(self, metrics: dict[str, Any]) -> None:
        """Append one step; the whole file is rewritten so object stores see a complete file."""
        self._lines.append(json.dumps(metrics, sort_keys=True))
        with self.fs.open(self.path, "w") as handle:
            handle.write("\n".join(self._lines) + "\n")

    def write_text(self, name: str, text: str) -> None:
        with self.fs.open(f"{self.root.rstrip('/')}/{name}", "w") as handle:
            handle.write(text)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    fs, root = fsspec.core.url_to_fs(run_dir)
    with fs.open(f"{root.rstrip('/')}/metrics.jsonl") as handle:
        return [json.loads(line) for line in handle.read().decode().splitlines() if line.strip()]
