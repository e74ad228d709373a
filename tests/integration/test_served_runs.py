"""Served runs against a real local Prefect server, read back through Prefect's API.

- ``prefect deployment run rl-train/colocate`` from the command line, with overrides of its
  own: it trains, and the deployment still pins its mode.
- A run of ``rl-train/sync`` started from another directory, with relative paths and no
  ``run.name``: its paths resolve under serve's root, it gets a run directory of its own, its
  step sub-flows are ``<run>/step-N``, and its page holds the step lines, the progress, the
  latest metrics and the reward curve. A run whose config file is missing fails naming the
  absolute path it tried.
- ``rl-train serve`` SIGKILLed with its run: the run reaches Crashed by itself, and its retry
  through Prefect's API, run by a new serve, continues at the step it was killed in. (A Failed
  run's retry: ``test_served_retry.py``.)
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
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
from serve_fixture import (
    BIN,
    assert_every_step_once,
    kill_marked,
    resume_lines,
    retry_flow_run,
    start_serve,
    step_lines,
    step_runs,
    wait_for,
    write_gate_sampler,
)

from rl_train.deployments.crash_detection import AUTOMATION_NAME, SILENCE_ENV, ensure_crash_automation
from rl_train.flows.ui import artifact_key

pytestmark = pytest.mark.integration

CRASH_TOTAL_STEPS = 6
GROUPS_PER_STEP = 8
"""``trainer.train_batch_size`` of the serve root's config: prompt groups per step."""


def test_served_runs_from_the_api_and_the_command_line(
    prefect_server: dict[str, str], serve_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = uuid.uuid4().hex
    serve = start_serve(prefect_server, serve_root, tmp_path / "serve.log", marker, **{SILENCE_ENV: "40"})
    monkeypatch.chdir(tmp_path)  # the runs are asked for from elsewhere
    try:
        run = run_deployment("rl-train/sync", parameters={"config": "run.yaml"}, timeout=600)
        missing = run_deployment("rl-train/sync", parameters={"config": "absent.yaml"}, timeout=300)
        cli = subprocess.run(
            [
                str(BIN / "prefect"),
                "deployment",
                "run",
                "rl-train/colocate",
                "-p",
                "config=run.yaml",
                "-p",  # a run's own overrides: the deployment still pins its mode
                'overrides=["trainer.mode=sync", "trainer.total_steps=2"]',
                "--watch",
            ],
            env=prefect_server,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        kill_marked(marker)
    assert run.state.is_completed(), f"{run.state}\n{(tmp_path / 'serve.log').read_text()[-4000:]}"
    assert missing.state.is_failed() and f"{serve_root}/absent.yaml" in missing.state.message
    assert cli.returncode == 0 and "Completed" in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    (colocate_dir,) = (serve_root / "runs").glob("colocate_async-*")
    assert len((colocate_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "mode: colocate_async" in (colocate_dir / "config.yaml").read_text()

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
        logs = wait_for(
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
@pytest.mark.timeout(1200)  # two serves, two runs' start-up (Ray, pools) on a loaded machine
def test_a_killed_served_run_reaches_crashed_by_itself_and_a_retry_continues_at_the_failed_step(
    prefect_server: dict[str, str], serve_root: Path, tmp_path: Path
) -> None:
    """serve and its run are SIGKILLed in step 4, as when their machine dies: nobody is left to
    report, and the server's automation marks the run Crashed once its heartbeats stop. A new
    serve then runs the retried flow run, which resumes from checkpoint 3: steps 4 to 6 once
    each, and the files of the first try (config, checkpoints 1-3, rows 1-3) as they were."""
    sampler, in_step_4 = write_gate_sampler(serve_root, step=4, hang=True)  # the first try hangs there
    overrides = [
        f"replay.sampler={sampler}",
        "checkpoint.every_steps=1",
        "checkpoint.keep_last=10",  # the first try's checkpoints stay, to be compared
        f"trainer.total_steps={CRASH_TOTAL_STEPS}",
    ]
    # The shortest silence Prefect's 30 s heartbeat floor allows, to keep the test short.
    env = {SILENCE_ENV: "40", "PYTHONPATH": os.pathsep.join(filter(None, [str(serve_root), os.environ.get("PYTHONPATH")]))}
    markers = [uuid.uuid4().hex, uuid.uuid4().hex]  # the first serve's processes, the second's
    serves = [start_serve(prefect_server, serve_root, tmp_path / "serve.log", markers[0], **env)]
    try:
        with get_client(sync_client=True) as client:
            (automation,) = client.read_automations_by_name(AUTOMATION_NAME)
            assert automation.trigger.within.total_seconds() == 40
            assert ensure_crash_automation(40) == "unchanged"  # a second serve leaves it be
            run = run_deployment("rl-train/sync", parameters={"config": "run.yaml", "overrides": overrides}, timeout=0)
            run_dir = serve_root / "runs" / f"sync-{run.name}-{run.id.hex[:8]}"
            wait_for(lambda: client.read_flow_run(run.id).state.is_running(), 180, "the run to start", serves[0])
            # Two heartbeats, 30 s apart (Prefect's default period, 180 s, would outlast the silence).
            beats = wait_for(
                lambda: (b := _heartbeats(prefect_server["PREFECT_API_URL"], run.id)) and len(b) >= 2 and b,
                90,
                "two heartbeats",
            )
            assert abs((beats[0] - beats[1]).total_seconds()) < 40, beats
            checkpoint_3 = run_dir / "checkpoints" / "step-00000003" / "manifest.json"
            wait_for(lambda: in_step_4.exists() and checkpoint_3.exists(), 240, "step 4, checkpoint 3 committed", serves[0])
            os.kill(serves[0].pid, signal.SIGKILL)  # first the runner, which would report its child's death
            kill_marked(markers[0])
            killed = time.time()
            state = wait_for(
                lambda: (s := client.read_flow_run(run.id).state).is_final() and s, 120, "a final state"
            )
            crashed_after = time.time() - killed
            assert state.is_crashed(), state
            assert "no heartbeat" in state.message
            first_try = _files(run_dir)
            first_rows = (run_dir / "metrics.jsonl").read_text().splitlines()
            assert [json.loads(row)["step"] for row in first_rows] == [1, 2, 3]

            serves.append(start_serve(prefect_server, serve_root, tmp_path / "serve-2.log", markers[1], **env))
            retry_flow_run(client, run.id)
            retried = time.time()
            state = wait_for(
                lambda: (s := client.read_flow_run(run.id).state).is_final() and s, 600, "the retry to end", serves[1]
            )
            lines = wait_for(
                lambda: (ls := step_lines(client, run.id)) and len(ls) >= CRASH_TOTAL_STEPS and ls, 30, "the step lines"
            )
            steps = step_runs(client, run.id)
    finally:
        for serve, marker in zip(serves, markers, strict=False):
            serve.kill()
            serve.wait(timeout=30)
            kill_marked(marker)
    print(f"Crashed {crashed_after:.0f} s after the kill; the retry ended {time.time() - retried:.0f} s after it")
    assert state.is_completed(), f"{state}\n{(tmp_path / 'serve-2.log').read_text()[-4000:]}"

    assert sorted(p.name for p in (serve_root / "runs").iterdir()) == [run_dir.name]  # the same directory
    assert_every_step_once(run_dir, CRASH_TOTAL_STEPS, GROUPS_PER_STEP)
    (resumed,) = resume_lines(tmp_path / "serve-2.log")  # the retry's stderr, in serve's output
    assert resumed.startswith(f"resuming {run_dir} from checkpoint {run_dir}/checkpoints/step-00000003: step 4 is next")
    assert lines == [f"step    {k}/{CRASH_TOTAL_STEPS}" for k in range(1, CRASH_TOTAL_STEPS + 1)]  # its page
    now = _files(run_dir)
    assert {path: now.get(path) for path in first_try} == first_try  # nothing of the first try replaced
    assert (run_dir / "metrics.jsonl").read_text().splitlines()[:3] == first_rows
    assert [(s.name.rsplit("/", 1)[-1], s.state.type.value) for s in steps[:3]] == [
        ("step-1", "COMPLETED"),
        ("step-2", "COMPLETED"),
        ("step-3", "COMPLETED"),
    ]
    # The killed try's step 4, which the retry marked Crashed before it began, then the retry's.
    assert [s.name.rsplit("/", 1)[-1] for s in steps[3:]] == ["step-4", "step-4", "step-5", "step-6"]
    assert steps[3].state.is_crashed() and "resumed from checkpoint 3" in steps[3].state.message, steps[3].state
    assert all(s.state.is_completed() for s in steps[4:]), [s.state for s in steps]


def _files(run_dir: Path) -> dict[str, bytes]:
    """The run's config and every checkpoint's files, by path under ``run_dir``."""
    paths = [run_dir / "config.yaml", *sorted((run_dir / "checkpoints").rglob("*"))]
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in paths if p.is_file()}


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
