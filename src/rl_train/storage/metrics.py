"""``<run_dir>/metrics.jsonl``: one JSON object per global step, through fsspec (local or s3://).

- **Earlier output is never destroyed.** A run directory that already holds ``metrics.jsonl``
  belongs to a previous run: it is refused (``RunDirectoryExistsError``) unless the run asks
  to overwrite it (``run.overwrite``). The CLI calls ``claim_run_dir`` before anything starts.
- **Appended per step where the filesystem appends in place** (local disk). Object stores
  (s3, gcs, and ``memory://``, which stands in for them in tests) have no in-place append:
  s3fs's mode ``"a"`` re-uploads the whole object. There the file is rewritten whole each
  step, so the store always holds a complete file.
- **Every line is strict JSON** (RFC 8259, which has no NaN or Infinity). A non-finite float
  is written as ``null``, and the line gets a ``nonfinite_values`` object naming each such
  value's key and what it was (``"nan"``, ``"inf"`` or ``"-inf"``); lines without one carry no
  such key. ``null`` keeps numeric columns numeric for any reader; the record keeps what it was.
"""

from __future__ import annotations

import json
import math
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

METRICS_FILE = "metrics.jsonl"
NONFINITE_KEY = "nonfinite_values"
"""Per line: key path -> "nan" / "inf" / "-inf" for each value written as null."""


class RunDirectoryExistsError(FileExistsError):
    """The run directory holds a previous run's metrics and the run did not ask to overwrite."""


def _metrics_path(root: str) -> str:
    return f"{root.rstrip('/')}/{METRICS_FILE}"


def check_run_dir(run_dir: str, overwrite: bool = False) -> None:
    """Refuse ``run_dir`` when it holds a previous run, unless ``overwrite``: fail before a run
    starts rather than replace another run's results."""
    fs, root = fsspec.core.url_to_fs(run_dir)
    if not overwrite and fs.exists(_metrics_path(root)):
        raise RunDirectoryExistsError(
            f"the run dir {run_dir} holds a previous run ({METRICS_FILE}); pick another run.name, "
            "or set run.overwrite=true to replace it"
        )


def claim_run_dir(run_dir: str, overwrite: bool = False) -> None:
    """``check_run_dir``, then (overwriting) remove the previous run's metrics, so that this
    run's lines never follow another run's."""
    check_run_dir(run_dir, overwrite)
    fs, root = fsspec.core.url_to_fs(run_dir)
    if fs.exists(_metrics_path(root)):
        fs.rm(_metrics_path(root))


def appends_in_place(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether appending a line to a file costs the line, not the file: true of local disk only."""
    return isinstance(fs, LocalFileSystem)


def to_json_line(metrics: dict[str, Any]) -> str:
    """``metrics`` as one strict-JSON line; non-finite floats become null (module docstring)."""
    nonfinite: dict[str, str] = {}
    clean = {key: _finite(value, str(key), nonfinite) for key, value in metrics.items()}
    if nonfinite:
        clean[NONFINITE_KEY] = nonfinite
    return json.dumps(clean, sort_keys=True, allow_nan=False)


def _finite(value: Any, path: str, nonfinite: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        nonfinite[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}", nonfinite) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{path}[{i}]", nonfinite) for i, v in enumerate(value)]
    return value


class MetricsWriter:
    """Writes one line per step to ``<run_dir>/metrics.jsonl`` (and other run files).

    ``resume_from``: a resumed run's lines up to its checkpoint; they replace the file (rows of
    later steps, which the run will redo, go), and the run appends after them. ``name``: a
    JSON-lines file other than ``metrics.jsonl`` with the same rules; ``claim``: check (and
    with ``overwrite`` clear) the run directory first, as a fresh run's metrics writer does.
    """

    def __init__(
        self,
        run_dir: str,
        overwrite: bool = False,
        *,
        resume_from: bytes | None = None,
        name: str = METRICS_FILE,
        claim: bool = True,
    ) -> None:
        if claim and resume_from is None:
            claim_run_dir(run_dir, overwrite)
        self.fs, self.root = fsspec.core.url_to_fs(run_dir)
        self.fs.makedirs(self.root, exist_ok=True)
        self.path = f"{self.root.rstrip('/')}/{name}"
        self._append = appends_in_place(self.fs)
        self._lines: list[str] = []
        """Every line so far, kept only where the file is rewritten whole."""
        if resume_from is not None or not claim:
            text = (resume_from or b"").decode()
            self._lines = [line + "\n" for line in text.splitlines() if line.strip()]
            self._replace("".join(self._lines))
            if self._append:
                self._lines = []

    def _replace(self, text: str) -> None:
        """Write the whole file through a temporary name, so a kill never leaves it torn."""
        partial = f"{self.path}.partial"
        with self.fs.open(partial, "w") as handle:
            handle.write(text)
        self.fs.mv(partial, self.path)

    def contents(self) -> bytes:
        """The file as it stands (what a checkpoint keeps of it)."""
        return self.fs.cat_file(self.path) if self.fs.exists(self.path) else b""

    def write(self, metrics: dict[str, Any]) -> None:
        """Add one step's line: appended in place, or the whole file rewritten on object stores."""
        line = to_json_line(metrics) + "\n"
        if self._append:
            with self.fs.open(self.path, "a") as handle:
                handle.write(line)
            return
        self._lines.append(line)
        with self.fs.open(self.path, "w") as handle:
            handle.write("".join(self._lines))

    def write_text(self, name: str, text: str) -> None:
        with self.fs.open(f"{self.root.rstrip('/')}/{name}", "w") as handle:
            handle.write(text)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The lines of ``metrics.jsonl``; a non-finite value reads as None (see ``NONFINITE_KEY``)."""
    fs, root = fsspec.core.url_to_fs(run_dir)
    with fs.open(_metrics_path(root)) as handle:
        return [json.loads(line) for line in handle.read().decode().splitlines() if line.strip()]
