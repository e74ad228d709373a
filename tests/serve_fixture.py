"""A real local Prefect server and ``rl-train serve`` against it, for the served-run tests.

``prefect_server`` starts ``prefect server start`` on a free port (SQLite in a temporary
PREFECT_HOME, its triggers service on); ``serve_root`` is a directory to serve from, with a
policy and a run config of relative paths only. ``start_serve`` starts serve there, marked so
that ``kill_marked`` can end exactly the processes it started (the runs, Ray's), by id.
``write_gate_sampler`` plants a replay sampler that stops a run at a step on its first try
only (raising, or hanging until it is killed): the served process imports it from the root.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.responses import SetStateStatus
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Scheduled

from rl_train.flows.ui import PROGRESS_LOGGER
from rl_train.runtime import EPHEMERAL_SERVER

BIN = Path(sys.executable).parent
MARKER = "RL_TRAIN_TEST_SERVE_MARKER"
"""Set in serve's environment: every process it starts (the run, Ray's) inherits it, so the
test can end exactly those processes, by id."""
GATE_MODULE = "rl_train_test_gate"
"""The module ``write_gate_sampler`` writes into the serve root."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen | None = None
) -> Any:
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


def processes_with(marker: str) -> list[int]:
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


def kill_marked(marker: str) -> None:
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``prefect server start`` on a free port, SQLite in a temporary PREFECT_HOME, with its
    triggers service on (the test process's throwaway-server defaults turn it off)."""
    port = free_port()
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
        wait_for(lambda: urllib.request.urlopen(health, timeout=2).status == 200, 180, "the server", server)
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


def start_serve(
    env: dict[str, str], root: Path, log: Path, marker: str, **extra_env: str
) -> subprocess.Popen:
    ray_dir = f"/tmp/rlt-srv-{marker[:8]}"  # short: Ray's socket paths are bounded
    atexit.register(shutil.rmtree, ray_dir, True)  # after the test has stopped serve
    env = {**env, MARKER: marker, "RL_TRAIN_RAY_TMPDIR": ray_dir, **extra_env}
    env.pop("RL_TRAIN_ROOT", None)  # the root is the directory serve starts in
    serve = subprocess.Popen(
        [str(BIN / "rl-train"), "serve"], env=env, cwd=root, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    try:
        with get_client(sync_client=True) as client:
            wait_for(lambda: client.read_deployment_by_name("rl-train/sync"), 180, "rl-train/sync", serve)
    except (RuntimeError, TimeoutError) as exc:
        serve.kill()
        raise AssertionError(f"{exc}; serve's output:\n{log.read_text()[-4000:]}") from None
    return serve


def write_gate_sampler(root: Path, step: int, hang: bool = False) -> tuple[str, Path]:
    """Write a replay sampler into ``root`` that stops the run at ``step`` the first time only:
    it raises before drawing a prompt, or (``hang``) hangs after generating the step's groups,
    until the process is killed. A marker file in ``root`` remembers the first time. Returns
    the ``replay.sampler`` value and the marker (it exists once the run reached ``step``).
    Serve needs ``PYTHONPATH=root``."""
    marker = root / f"gate-step-{step}"
    (root / f"{GATE_MODULE}.py").write_text(
        f'''"""Stops a served run at step {step}, the first time only."""
import pathlib
import time

from rl_train.storage.replay_buffer import ReplayBuffer

MARKER = pathlib.Path({str(marker)!r})


class GateSampler(ReplayBuffer):
    def dispatch(self, num_groups, step):
        first = step == {step} and not MARKER.exists()
        if first and not {hang!r}:
            MARKER.touch()
            raise RuntimeError("stopped on purpose at step {step}")
        keys = super().dispatch(num_groups, step)
        if first:
            MARKER.touch()
            while True:
                time.sleep(1)
        return keys
'''
    )
    return f"{GATE_MODULE}:GateSampler", marker


def retry_flow_run(client: SyncPrefectClient, flow_run_id: uuid.UUID) -> None:
    """What ``prefect flow-run retry <id>`` does to a finished run of a deployment: force it
    back to Scheduled; a runner serving the deployment then runs it again, in a new process."""
    result = client.set_flow_run_state(flow_run_id, Scheduled(message="Retried via CLI"), force=True)
    assert result.status == SetStateStatus.ACCEPT, result


def step_runs(client: SyncPrefectClient, flow_run_id: uuid.UUID) -> list[FlowRun]:
    """The run's step sub-flows, every try of each, oldest first."""
    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
    )
    return sorted(runs, key=lambda r: r.created)


def step_lines(client: SyncPrefectClient, flow_run_id: uuid.UUID) -> list[str]:
    """The step lines in the run's logs (every try's), ``step    k/N`` each, oldest first."""
    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    lines = sorted((log.timestamp, log.message) for log in logs if log.name == PROGRESS_LOGGER)
    return [message.split("|")[0].strip() for _, message in lines]


def resume_lines(serve_log: Path) -> list[str]:
    """The lines of serve's output (its runs' stderr) where a run says it resumes."""
    return [line for line in serve_log.read_text().splitlines() if line.startswith("resuming ")]


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_every_step_once(run_dir: Path, total_steps: int, groups_per_step: int) -> None:
    """``metrics.jsonl`` and the prompt ledger hold steps 1..total once each, in order, and the
    ledger every prompt group drawn once: sync draws groups p0, p1, ... in order, so a resumed
    run that lost or repeated a draw shows it here."""
    steps = list(range(1, total_steps + 1))
    assert [row["step"] for row in rows(run_dir / "metrics.jsonl")] == steps
    ledger = rows(run_dir / "trained_prompts.jsonl")
    assert [row["step"] for row in ledger] == steps
    groups = [group for row in ledger for group in row["groups"]]
    assert sorted(groups, key=lambda g: int(g[1:])) == [f"p{i}" for i in range(total_steps * groups_per_step)]
