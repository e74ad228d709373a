"""Integration fixtures: a small run config on disk; a real Prefect server and a root to serve from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serve_fixture import prefect_server, serve_root  # noqa: F401  (the served-run tests' fixtures)

from rl_train.storage.builtin_data import write_builtin_task


@pytest.fixture
def small_run_config(tiny_model_dir: Path, tmp_path: Path) -> dict[str, Any]:
    data_dir = tmp_path / "data"
    write_builtin_task("single_digit_sum", data_dir)
    return {
        "run": {"name": "it", "output_dir": str(tmp_path / "runs")},
        "model": {"path": str(tiny_model_dir), "create_if_missing": False},
        "data": {"builtin_task": None, "data_dir": str(data_dir)},
        "trainer": {"total_steps": 3, "train_batch_size": 8, "val_every_steps": 3, "val_before_train": False},
        "rollout": {"n": 4, "max_new_tokens": 4, "num_threads": 1},
        "actor": {"num_threads": 1},
    }


