"""spawn's contract: the gateway relay reaches one endpoint and nothing else, nothing outlives
the Sandboxed, and where bubblewrap cannot start the run is refused or, when allowed, runs
with a warning."""

from __future__ import annotations

import http.server
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_train.engines.sandbox import GRACE_S, Limits, SandboxUnavailable, run_python, sandbox_problem, spawn
from rl_train.engines.sandbox.gateway import GatewayRelay

CLIENT = """
import sys, urllib.request
for port in sys.argv[1:]:
    try:
        print(port, urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode())
    except OSError as error:
        print(port, "unreachable", type(error).__name__)
"""


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the handler's name)
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[list[int]]:
    """Two HTTP servers on the host's loopback: the gateway and one the sandbox must not reach."""
    running = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello) for _ in range(2)]
    for server in running:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [int(server.server_address[1]) for server in running]
    for server in running:
        server.shutdown()
        server.server_close()


def test_the_gateway_reaches_its_endpoint_and_nothing_else(servers: list[int]) -> None:
    gateway, other = servers
    argv = [sys.executable, "-I", "-c", CLIENT, str(gateway), str(other)]
    limits = Limits(wall_s=20.0)
    with spawn(argv, limits=limits, env={}, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
               gateway=("127.0.0.1", gateway)) as process:  # fmt: skip
        assert process.wait(limits.wall_s) == 0
        assert process.stdout is not None and process.stderr is not None
        out, err = process.stdout.read().decode(), process.stderr.read().decode()
        relay = process._relay
    assert f"{gateway} hello from {gateway}" in out, (out, err)
    assert f"{other} unreachable" in out, (out, err)
    assert relay is not None and not Path(relay.folder).exists()  # no socket file outlives it


def test_the_relay_connects_only_to_its_target(servers: list[int]) -> None:
    """The trainer's side: whatever arrives on the socket goes to the one target."""
    import socket

    relay = GatewayRelay(("127.0.0.1", servers[0]))
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(relay.socket_path)
            client.sendall(b"GET / HTTP/1.0\r\nHost: elsewhere\r\n\r\n")
            answer = b""
            while chunk := client.recv(4096):
                answer += chunk
        assert answer.endswith(f"hello from {servers[0]}".encode())
    finally:
        relay.close()
    assert not Path(relay.folder).exists()


def test_kill_ends_the_whole_sandbox_and_is_idempotent() -> None:
    code = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(60)\n"
    argv = [sys.executable, "-I", "-c", code]
    started = time.monotonic()
    with spawn(argv, limits=Limits(wall_s=60.0), env={}, stdin=None, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL) as process:  # fmt: skip
        assert process.wait(0.5) is None
        process.kill()
        process.kill()
        assert process.wait(10.0) is not None
    assert time.monotonic() - started < 30


def test_the_deadline_is_kept_without_anyone_waiting() -> None:
    argv = [sys.executable, "-I", "-c", "import time\ntime.sleep(60)"]
    with spawn(argv, limits=Limits(wall_s=1.0), env={}, stdin=None, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL) as process:  # fmt: skip
        time.sleep(1.0 + GRACE_S + 3.0)
        assert process.wait(0) is not None and process.timed_out


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH without bubblewrap (only a python), and the cached answer forgotten around it."""
    (tmp_path / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox_problem.cache_clear()
    yield
    sandbox_problem.cache_clear()


def test_without_bubblewrap_untrusted_code_is_refused_naming_the_fix(no_bwrap: None) -> None:
    assert sandbox_problem() == "bubblewrap (bwrap) is not on PATH"
    with pytest.raises(SandboxUnavailable, match=r"apt-get install bubblewrap.*sandbox\.allow_unsandboxed: true"):
        run_python("print(1)", Limits(wall_s=5.0))


def test_allow_unsandboxed_runs_with_a_warning_each_time(no_bwrap: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        first = run_python("print(sum(range(10)))", Limits(wall_s=10.0), allow_unsandboxed=True)
        second = run_python("while True:\n    pass", Limits(wall_s=1.0), allow_unsandboxed=True)
    assert (first.stdout.strip(), first.exit_code) == ("45", 0), first
    assert second.timed_out, second
    folders = run_python("import os\nprint(os.getcwd())", Limits(wall_s=10.0), allow_unsandboxed=True)
    assert "rlt-unsandboxed-" in folders.stdout and not Path(folders.stdout.strip()).exists()  # removed
    warnings = [r for r in caplog.records if "WITHOUT a sandbox" in r.getMessage()]
    assert len(warnings) == 3  # one per run
