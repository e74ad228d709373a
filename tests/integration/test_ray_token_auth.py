"""Ray's token authentication through rl-train's start path: a process whose environment holds
the cluster's token (``RAY_AUTH_TOKEN``) starts or joins Ray with ``RAY_AUTH_MODE=token``
(``runtime.default_ray_auth_mode``), and its workers inherit it; a client without the token, or
with another one, is refused by the cluster.

The head is a local one started by ``ensure_ray`` in a child process (as ``rl-train train``
starts it); each client is a child process joining it by address, as a run with ``ray.address``
does. ``HOME`` is a temporary folder, so that no ``~/.ray/auth_token`` is read or written.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

HEAD = r"""
import sys
import ray
from rl_train.engines.workers.ray_start import ensure_ray
ensure_ray(None, 1)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes the pipe
"""

CLIENT = r"""
import json, os, sys
import ray
from rl_train.engines.workers.ray_start import ensure_ray
try:
    ensure_ray(sys.argv[1], None)

    @ray.remote(num_cpus=0)
    class Probe:
        def env(self):
            return {"mode": os.environ.get("RAY_AUTH_MODE"), "token": bool(os.environ.get("RAY_AUTH_TOKEN"))}

    print(json.dumps({"joined": True, "actor": ray.get(Probe.remote().env.remote(), timeout=120)}), flush=True)
except Exception as error:  # what a refused client sees
    print(json.dumps({"joined": False, "error": f"{type(error).__name__}: {error}"[:2000]}), flush=True)
"""

REFUSED_WITHIN_S = 180
"""Ray's client retries for about 20 s before it gives up; the rest is grace for a loaded machine."""


def _env(home: Path, ray_tmp: Path, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RL_TRAIN_RAY_TMPDIR=str(ray_tmp), RL_TRAIN_RAY_LEAN_HEAD="1")
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return env


@pytest.fixture
def folders() -> Iterator[tuple[Path, Path]]:
    """(HOME, Ray's temp dir): short paths, for Ray's AF_UNIX sockets."""
    with tempfile.TemporaryDirectory(prefix="rlt-auth-", dir="/tmp") as path:
        (Path(path) / "home").mkdir()
        (Path(path) / "ray").mkdir()
        yield Path(path) / "home", Path(path) / "ray"


def _client(address: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, address], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _result(client: subprocess.Popen[str]) -> dict:
    out, err = client.communicate(timeout=REFUSED_WITHIN_S)
    lines = out.strip().splitlines()
    assert lines, f"the client printed nothing:\n{err[-3000:]}"
    return json.loads(lines[-1])


def test_a_token_cluster_admits_a_client_with_its_token_and_refuses_the_others(
    folders: tuple[Path, Path],
) -> None:
    home, ray_tmp = folders
    token = secrets.token_hex(32)
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD], env=_env(home, ray_tmp, token), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert head.stdout is not None
        address = head.stdout.readline().strip()
        assert address, head.stderr.read() if head.stderr else ""
        clients = {
            "with the token": _client(address, _env(home, ray_tmp, token)),
            "without a token": _client(address, _env(home, ray_tmp, None)),
            "with another token": _client(address, _env(home, ray_tmp, secrets.token_hex(32))),
        }
        results = {name: _result(client) for name, client in clients.items()}
    finally:
        head.communicate(timeout=60)  # closes its stdin: the head's driver exits, its node with it
    admitted = results["with the token"]
    assert admitted["joined"], admitted
    assert admitted["actor"] == {"mode": "token", "token": True}  # the workers inherit it
    for name in ("without a token", "with another token"):
        assert not results[name]["joined"], (name, results[name])
        assert "ConnectionError" in results[name]["error"] or "Authentication" in results[name]["error"]
    assert not (home / ".ray").exists()  # no token was generated or written under HOME
