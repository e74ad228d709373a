"""metrics.jsonl: earlier runs are never destroyed, steps are appended where the filesystem
can append, and every line is strict JSON."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from rl_train.config import load_config
from rl_train.storage.metrics import (
    NONFINITE_KEY,
    MetricsWriter,
    RunDirectoryExistsError,
    check_run_dir,
    claim_run_dir,
    read_metrics,
)


def _strict_loads(line: str) -> dict[str, Any]:
    """json.loads that rejects NaN / Infinity / -Infinity, as RFC 8259 parsers do."""

    def reject(constant: str) -> Any:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


@pytest.fixture(params=["local", "memory"])
def run_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A run directory on local disk, or on the in-memory filesystem standing in for an object store."""
    if request.param == "local":
        yield str(tmp_path / "runs" / "exp")
        return
    root = f"memory://metrics-test-{uuid.uuid4().hex}"
    yield f"{root}/runs/exp"
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def _lines(run_dir: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(run_dir)
    return fs.cat(f"{root}/metrics.jsonl").decode().splitlines()


def test_a_reused_run_dir_is_refused_and_the_previous_run_is_kept(run_dir: str) -> None:
    first = MetricsWriter(run_dir)
    first.write({"step": 1, "reward/mean": 0.5})
    first.write({"step": 2, "reward/mean": 0.75})
    with pytest.raises(RunDirectoryExistsError, match=r"previous run.*run\.name.*run\.overwrite=true"):
        MetricsWriter(run_dir)
    with pytest.raises(RunDirectoryExistsError):
        check_run_dir(run_dir)
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2]


def test_overwrite_replaces_the_previous_run(run_dir: str) -> None:
    MetricsWriter(run_dir).write({"step": 1, "reward/mean": 0.5})
    check_run_dir(run_dir, overwrite=True)
    second = MetricsWriter(run_dir, overwrite=True)
    second.write({"step": 1, "reward/mean": 0.25})
    assert read_metrics(run_dir) == [{"step": 1, "reward/mean": 0.25}]


def test_claiming_with_overwrite_clears_the_previous_run_before_the_writer_starts(run_dir: str) -> None:
    """The CLI claims the run dir first; a writer made afterwards finds no previous run."""
    MetricsWriter(run_dir).write({"step": 1, "reward/mean": 0.5})
    with pytest.raises(RunDirectoryExistsError):
        claim_run_dir(run_dir)
    assert len(read_metrics(run_dir)) == 1  # a refused claim removes nothing
    claim_run_dir(run_dir, overwrite=True)
    MetricsWriter(run_dir).write({"step": 1, "reward/mean": 0.25})
    assert read_metrics(run_dir) == [{"step": 1, "reward/mean": 0.25}]


def test_a_fresh_or_empty_run_dir_is_accepted(run_dir: str) -> None:
    check_run_dir(run_dir)
    writer = MetricsWriter(run_dir)
    writer.write_text("config.yaml", "run: {}\n")
    check_run_dir(run_dir)  # a run that wrote its config but no step yet left no metrics


def test_steps_are_appended_on_local_disk_and_rewritten_on_object_stores(run_dir: str) -> None:
    """A line added by someone else between two steps shows which: an append keeps it, a
    rewrite of the whole file (from the writer's own lines) does not."""
    writer = MetricsWriter(run_dir)
    writer.write({"step": 1})
    fs, root = fsspec.core.url_to_fs(run_dir)
    with fs.open(f"{root}/metrics.jsonl", "a") as handle:
        handle.write('{"note": "written between steps"}\n')
    writer.write({"step": 2})
    writer.write({"step": 3})
    lines = [_strict_loads(line) for line in _lines(run_dir)]
    if isinstance(fs, LocalFileSystem):
        assert lines == [{"step": 1}, {"note": "written between steps"}, {"step": 2}, {"step": 3}]
    else:
        assert lines == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_non_finite_values_are_written_as_strict_json_null_and_named(run_dir: str) -> None:
    writer = MetricsWriter(run_dir)
    writer.write(
        {"step": 1, "actor/grad_norm": math.nan, "a": math.inf, "b": -math.inf, "c": [1.0, math.nan]}
    )
    writer.write({"step": 2, "actor/grad_norm": 0.5})
    first, second = (_strict_loads(line) for line in _lines(run_dir))
    assert first == {
        "step": 1,
        "actor/grad_norm": None,
        "a": None,
        "b": None,
        "c": [1.0, None],
        NONFINITE_KEY: {"actor/grad_norm": "nan", "a": "inf", "b": "-inf", "c[1]": "nan"},
    }
    assert second == {"step": 2, "actor/grad_norm": 0.5}  # finite lines carry no record


def test_run_overwrite_is_a_documented_config_key_off_by_default() -> None:
    assert load_config(None, []).run.overwrite is False
    assert load_config(None, ["run.overwrite=true"]).run.overwrite is True
