"""A real local Prefect server (SQLite), `rl-train serve`, and `prefect deployment run rl-train/sync`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def test_deployment_run_trains(prefect_server: dict[str, str], small_run_yaml: Path, tmp_path: Path) -> None:
    env = {**prefect_server, "RL_TRAIN_RAY_TMPDIR": f"/tmp/rlt-dep-{os.getpid()}"}
    serve_log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [str(BIN / "rl-train"), "serve"], env=env, stdout=serve_log, stderr=subprocess.STDOUT
    )
    try:

        def deployment_exists() -> bool:
            out = subprocess.run(
                [str(BIN / "prefect"), "deployment", "ls"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return "rl-train/sync" in out.stdout

        _wait_for(deployment_exists, 180, "deployment rl-train/sync", serve)
        run = subprocess.run(
            [
                str(BIN / "prefect"),
                "deployment",
                "run",
                "rl-train/colocate",
                "-p",
                f"config={small_run_yaml}",
                "-p",  # a run's own overrides: the deployment still pins its mode
                'overrides=["trainer.mode=sync", "trainer.total_steps=2"]',
                "--watch",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout + run.stderr + (tmp_path / "serve.log").read_text()[-4000:]
        assert "Completed" in run.stdout + run.stderr
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    runs_dir = Path(__import__("yaml").safe_load(small_run_yaml.read_text())["run"]["output_dir"]) / "it"
    assert len((runs_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "mode: colocate_async" in (runs_dir / "config.yaml").read_text()
