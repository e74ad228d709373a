"""Served runs against a real local Prefect server, read back through Prefect's API.

- A run of ``rl-train/sync`` started from another directory, with relative paths and no
  ``run.name``: its paths resolve under serve's root, it gets a run directory of its own, its
  step sub-flows are ``<run>/step-N``, and its page holds the step lines, the progress, the
  latest metrics and the reward curve. A run whose config file is missing fails naming the
  absolute path it tried.
- ``rl-train serve`` SIGKILLed with its run: the run reaches Crashed by itself.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from rl_train.deployments.crash_detection import AUTOMATION_NAME, SILENCE_ENV, ensure_crash_automation
from rl_train.flows.ui import artifact_key
from rl_train.runtime import EPHEMERAL_SERVER

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
MARKER = "RL_TRAIN_TEST_SERVE_MARKER"
"""Set in serve's environment: every process it starts (the run, Ray's) inherits it, so the
test can end exactly those processes, by id."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen | None = None) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        try:
            value = predicate()
            if value:
                return value
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _processes_with(marker: str) -> list[int]:
    """This user's processes whose environment holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue  # gone, or another user's
    return pids


def _kill_marked(marker: str) -> None:
    for pid in _processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``prefect server start`` on a free port, SQLite in a temporary PREFECT_HOME, with its
    triggers service on (the test process's throwaway-server defaults turn it off)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in EPHEMERAL_SERVER}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_UI_ENABLED="false",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        health = f"http://127.0.0.1:{port}/api/health"
        _wait_for(lambda: urllib.request.urlopen(health, timeout=2).status == 200, 180, "the server", server)
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def serve_root(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A directory to serve from, holding the policy and a run config with relative paths only
    and no run.name."""
    root = tmp_path / "root"
    (root / "models").mkdir(parents=True)
    (root / "models" / "tiny").symlink_to(tiny_model_dir)
    config = {
        "run": {"output_dir": "runs"},
        "model": {"path": "models/tiny", "create_if_missing": False},
        "data": {"builtin_task": "single_digit_sum", "data_dir": "data/sds"},
        "trainer": {"total_steps": 2, "train_batch_size": 8, "val_every_steps": 2, "val_before_train": False},
        "rollout": {"n": 4, "max_new_tokens": 4, "num_threads": 1},
        "actor": {"num_threads": 1},
    }
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    return root


def _start_serve(env: dict[str, str], root: Path, log: Path, marker: str, **extra_env: str) -> subprocess.Popen:
    env = {**env, MARKER: marker, "RL_TRAIN_RAY_TMPDIR": f"/tmp/rlt-srv-{marker[:8]}", **extra_env}
    env.pop("RL_TRAIN_ROOT", None)  # the root is the directory serve starts in
    serve = subprocess.Popen(
        [str(BIN / "rl-train"), "serve"], env=env, cwd=root, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    try:
        with get_client(sync_client=True) as client:
            _wait_for(lambda: client.read_deployment_by_name("rl-train/sync"), 180, "rl-train/sync", serve)
    except (RuntimeError, TimeoutError) as exc:
        serve.kill()
        raise AssertionError(f"{exc}; serve's output:\n{log.read_text()[-4000:]}") from None
    return serve


def test_served_run_page_paths_and_run_name(
    prefect_server: dict[str, str], serve_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = uuid.uuid4().hex
    serve = _start_serve(prefect_server, serve_root, tmp_path / "serve.log", marker, **{SILENCE_ENV: "40"})
    monkeypatch.chdir(tmp_path)  # the runs are asked for from elsewhere
    try:
        run = run_deployment("rl-train/sync", parameters={"config": "run.yaml"}, timeout=600)
        missing = run_deployment("rl-train/sync", parameters={"config": "absent.yaml"}, timeout=300)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        _kill_marked(marker)
    assert run.state.is_completed(), f"{run.state}\n{(tmp_path / 'serve.log').read_text()[-4000:]}"
    assert missing.state.is_failed() and f"{serve_root}/absent.yaml" in missing.state.message

    run_name = f"sync-{run.name}-{run.id.hex[:8]}"  # no run.name: one directory per flow run
    run_dir = serve_root / "runs" / run_name
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert f"path: {serve_root}/models/tiny" in (run_dir / "config.yaml").read_text()
    assert (serve_root / "data" / "sds" / "train.parquet").exists()

    with get_client(sync_client=True) as client:
        steps = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id]))
        )
        assert sorted(s.name for s in steps) == [f"{run_name}/step-1", f"{run_name}/step-2"]
        logs = _wait_for(
            lambda: [
                log.message
                for log in client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                if log.name == "rl_train.progress"
            ],
            30,
            "the step lines",
        )
        assert [line.split("|")[0].strip() for line in logs] == ["step    1/2", "step    2/2"]
        assert "val " in logs[1]  # the last step validated
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    by_type: dict[str, list[Any]] = {}
    for artifact in sorted(artifacts, key=lambda a: a.created):
        by_type.setdefault(artifact.type, []).append(artifact)
    (progress,) = by_type["progress"]
    assert progress.key == artifact_key(run_name, "progress") and progress.data == 100.0
    tables = by_type["table"]
    assert [t.key for t in tables] == [artifact_key(run_name, "metrics")] * 2  # one version per step
    latest = {row["metric"]: row["value"] for row in _table_rows(tables[-1].data)}
    assert latest["step"] == 2 and "reward/mean" in latest and "val/reward_mean" in latest
    (curve,) = by_type["markdown"]
    assert curve.key == artifact_key(run_name, "reward-curve")
    uri = re.search(r"\]\(data:image/svg\+xml;base64,([^)]+)\)", curve.data).group(1)
    lines = ET.fromstring(base64.b64decode(uri)).iter("{http://www.w3.org/2000/svg}polyline")
    assert {line.get("data-label") for line in lines} == {"reward/mean", "val/reward_mean"}

    # Its heartbeats stopped when it completed; its Completed state ended the crash automation's
    # wait, so the silence after it changes nothing.
    time.sleep(max(0.0, run.state.timestamp.timestamp() + 50 - time.time()))
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.is_completed()


def _table_rows(data: Any) -> list[dict[str, Any]]:
    """A table artifact's rows: the API returns the table as JSON text."""
    return json.loads(data) if isinstance(data, str) else data


@pytest.mark.slow
def test_a_killed_served_run_reaches_crashed_by_itself(
    prefect_server: dict[str, str], serve_root: Path, tmp_path: Path
) -> None:
    """serve and its run are SIGKILLed, as when their machine dies: nobody is left to report,
    and the server's automation marks the run Crashed once its heartbeats stop."""
    marker = uuid.uuid4().hex
    cfg = yaml.safe_load((serve_root / "run.yaml").read_text())
    cfg["trainer"]["total_steps"] = 1000  # still running when it is killed
    (serve_root / "run.yaml").write_text(yaml.safe_dump(cfg))
    # The shortest silence Prefect's 30 s heartbeat floor allows, to keep the test short.
    serve = _start_serve(prefect_server, serve_root, tmp_path / "serve.log", marker, **{SILENCE_ENV: "40"})
    try:
        with get_client(sync_client=True) as client:
            (automation,) = client.read_automations_by_name(AUTOMATION_NAME)
            assert automation.trigger.within.total_seconds() == 40
            assert ensure_crash_automation(40) == "unchanged"  # a second serve leaves it be
            run = run_deployment("rl-train/sync", parameters={"config": "run.yaml"}, timeout=0)
            _wait_for(lambda: client.read_flow_run(run.id).state.is_running(), 180, "the run to start", serve)
            # Two heartbeats, 30 s apart (Prefect's default period, 180 s, would outlast the silence).
            beats = _wait_for(
                lambda: (b := _heartbeats(prefect_server["PREFECT_API_URL"], run.id)) and len(b) >= 2 and b,
                90,
                "two heartbeats",
            )
            assert abs((beats[0] - beats[1]).total_seconds()) < 40, beats
            os.kill(serve.pid, signal.SIGKILL)  # first the runner, which would report its child's death
            _kill_marked(marker)
            killed = time.time()
            state = _wait_for(
                lambda: (s := client.read_flow_run(run.id).state).is_final() and s, 120, "a final state"
            )
    finally:
        serve.kill()
        serve.wait(timeout=30)
        _kill_marked(marker)
    assert state.is_crashed(), state
    assert "no heartbeat" in state.message
    print(f"Crashed {time.time() - killed:.0f} s after the kill")


def _heartbeats(api_url: str, flow_run_id: uuid.UUID) -> list[datetime]:
    """When the flow run's recorded heartbeats occurred."""
    body = {
        "filter": {
            "event": {"name": ["prefect.flow-run.heartbeat"]},
            "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
        },
        "limit": 10,
    }
    request = urllib.request.Request(
        f"{api_url}/events/filter",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return [datetime.fromisoformat(e["occurred"]) for e in json.loads(response.read())["events"]]
