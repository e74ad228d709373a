"""The lean local Ray head (engines/workers/local_ray_head.py): a run's local Ray starts without
the dashboard's API server and the autoscaler's monitor, starts a worker process per actor at
once, serves actors as ``ray.init()``'s does, and leaves none of its processes behind, whether
the driver exits or is killed.

Each case starts its own Ray in a child process (the session's Ray stays untouched) and reads
the child's process tree from /proc.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHILD = r"""
import json, os, sys
from pathlib import Path
from rl_train.engines.workers.ray_start import ensure_ray
import ray

ensure_ray(None, 1, num_actors=5)

@ray.remote(num_cpus=0)
class Echo:
    def pid(self) -> int:
        return os.getpid()

echo = Echo.remote()
actor_pid = ray.get(echo.pid.remote())

def tree(pid):
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            kids.append(int(child))
    return kids + [g for k in kids for g in tree(k)]

def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""

def listening(pids):
    # the local address (hex, as /proc/net shows it) of every TCP socket these processes listen on
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found

pids = sorted(set(tree(os.getpid())) | {actor_pid})
report = {"actor": actor_pid, "processes": {p: cmdline(p) for p in pids}}
report["listening"] = listening(pids + [os.getpid()])
report["imported_dashboard_deps"] = "ray.dashboard.optional_deps" in sys.modules
print(json.dumps(report), flush=True)
if sys.argv[1] == "wait":
    sys.stdin.read()  # until the test kills this process
"""

GONE_SECONDS = 20.0
"""How long the node's processes may take to exit after the driver (Ray's reaper polls)."""


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir: Ray's socket paths under it must fit AF_UNIX's 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="rlt-head-", dir="/tmp") as path:
        yield Path(path)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_child(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], dict]:
    env = {**os.environ, "RL_TRAIN_RAY_TMPDIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    env.setdefault("RL_TRAIN_RAY_LEAN_HEAD", "1")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, how], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=60)
        pytest.fail(f"the child printed nothing:\n{child.stderr.read() if child.stderr else ''}")
    return child, json.loads(line)


def _host(hex_address: str) -> str:
    """The host of a /proc/net/tcp{,6} local address: each 32-bit word is in host (little-endian) order."""
    host = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(host[i : i + 4][::-1] for i in range(0, len(host), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_SECONDS
    while time.monotonic() < deadline:
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if _alive(pid)]


def _node_processes(report: dict) -> dict[int, str]:
    return {int(pid): cmd for pid, cmd in report["processes"].items()}


def _gcs_system_config(commands: list[str]) -> dict:
    gcs = next(cmd for cmd in commands if "gcs_server" in cmd.split(" ", 1)[0])
    encoded = next(arg for arg in gcs.split() if arg.startswith("--config_list="))
    return json.loads(base64.b64decode(encoded.partition("=")[2]))


def test_a_local_head_runs_actors_without_the_dashboard_or_the_autoscaler(ray_tmp: Path) -> None:
    child, report = _start_child(ray_tmp, "exit")
    try:
        commands = " | ".join(_node_processes(report).values())
        assert "gcs_server" in commands and "raylet" in commands
        # one worker process started at once per actor of the run (5), not per CPU (1)
        assert _gcs_system_config(list(_node_processes(report).values()))["worker_maximum_startup_concurrency"] == 5
        assert "log_monitor.py" in commands  # the actors' output still reaches the driver
        assert "dashboard/dashboard.py" not in commands
        assert "autoscaler/_private/monitor.py" not in commands
        # the raylet's agent is the full one (its dependencies were looked up, not imported)
        agent = next(cmd for cmd in commands.split(" | ") if "dashboard/agent.py" in cmd)
        assert "--minimal" not in agent.split()
        assert report["imported_dashboard_deps"] is False
    finally:
        child.communicate(timeout=60)
    assert child.returncode == 0
    assert _wait_gone(list(_node_processes(report))) == []


def test_a_killed_driver_leaves_no_ray_process_behind(ray_tmp: Path) -> None:
    child, report = _start_child(ray_tmp, "wait")
    pids = list(_node_processes(report))
    assert report["actor"] in pids and all(_alive(pid) for pid in pids)
    os.kill(child.pid, signal.SIGKILL)  # no exit hook runs: Ray's reaper must stop the node
    child.communicate(timeout=30)
    left = _wait_gone(pids)
    assert left == [], {pid: _node_processes(report)[pid] for pid in left}


@pytest.mark.parametrize("lean", ["1", "0"], ids=["lean-head", "plain-ray-init"])
def test_every_socket_a_local_head_listens_on_is_on_loopback(
    ray_tmp: Path, lean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GCS, the raylet (node manager, object manager), the agents, the driver's and the
    actor's gRPC servers: a local Ray is reachable from this machine only."""
    monkeypatch.setenv("RL_TRAIN_RAY_LEAN_HEAD", lean)
    child, report = _start_child(ray_tmp, "exit")
    try:
        hosts = [_host(address) for address in report["listening"]]
        commands = " | ".join(_node_processes(report).values())
        assert "gcs_server" in commands and len(hosts) >= 4  # GCS, raylet x2, driver, actor at least
        assert set(hosts) <= {"127.0.0.1", "::ffff:127.0.0.1"}, hosts
    finally:
        child.communicate(timeout=60)
    assert child.returncode == 0
