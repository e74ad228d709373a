"""``spawn``: one untrusted program, started in a sandbox, with a deadline kept from outside."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import IO, Any

from rl_train.engines.sandbox.bwrap import (
    GATEWAY_DIR,
    SHIM,
    SandboxUnavailable,
    args_file,
    bwrap_command,
    bwrap_options,
    bwrap_path,
    sandbox_problem,
    unavailable_message,
)
from rl_train.engines.sandbox.config import GRACE_S, Limits
from rl_train.engines.sandbox.gateway import SOCKET_NAME, GatewayRelay
from rl_train.engines.sandbox.pids import PidsCgroup, pids_cgroup

log = logging.getLogger(__name__)
Stream = int | IO[bytes] | None
_LIBC = ctypes.CDLL(None)
"""Resolved once here: the child between fork and exec should call nothing that loads a library."""
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_setup(cgroup: PidsCgroup | None) -> Any:
    if cgroup is None:
        return _die_with_parent

    def setup() -> None:
        cgroup.join()
        _die_with_parent()

    return setup


class Sandboxed:
    """One running sandboxed program (a context manager: leaving it kills, reaps and cleans up).

    A timer SIGKILLs its whole process group at ``limits.wall_s + GRACE_S`` whatever the caller
    does; in a sandbox that kills bubblewrap, whose death kills the sandbox's PID namespace.
    ``stdin``, ``stdout`` and ``stderr`` are the pipes asked for with ``subprocess.PIPE``."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        limits: Limits,
        relay: GatewayRelay | None,
        folder: str | None,
        cgroup: PidsCgroup | None = None,
    ):
        self._popen = popen
        self._cgroup = cgroup
        self.pid = popen.pid
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr
        self._relay = relay
        self._folder = folder
        self._lock = threading.Lock()
        self.timed_out = False
        """Whether the deadline killed it."""
        self._timer = threading.Timer(limits.wall_s + GRACE_S, self._deadline)
        self._timer.daemon = True
        self._timer.start()

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code (negative: killed by that signal), or None while it still runs."""
        try:
            return self._popen.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the whole group (idempotent)."""
        with self._lock:
            if self._popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._popen.pid, signal.SIGKILL)

    def _deadline(self) -> None:
        if self._popen.poll() is None:
            self.timed_out = True
            self.kill()

    def close(self) -> None:
        """Kill, reap, close the pipes, stop the gateway relay, remove the working folder."""
        self._timer.cancel()
        self.kill()
        self._popen.wait()
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self._relay is not None:
            self._relay.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        if self._cgroup is not None:
            self._cgroup.remove()

    def __enter__(self) -> Sandboxed:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def spawn(
    argv: Sequence[str],
    *,
    limits: Limits,
    env: Mapping[str, str],
    stdin: Stream,
    stdout: int | IO[bytes],
    stderr: int | IO[bytes],
    gateway: tuple[str, int] | None = None,
    allow_unsandboxed: bool = False,
    visible: Sequence[str] = (),
) -> Sandboxed:
    """Starts ``argv`` in a sandbox under ``limits`` with only ``env`` for environment.

    ``gateway=(host, port)``: inside, 127.0.0.1:port reaches that endpoint and nothing else.
    ``visible``: host paths the program needs that sit under a hidden folder (homes), shown
    read-only. Where bubblewrap cannot start: ``SandboxUnavailable``, or with
    ``allow_unsandboxed`` the program runs with rlimits and a process group of its own only,
    and a warning is logged. Call from a thread that outlives the program: it is killed when
    the thread that started it ends (PDEATHSIG)."""
    if not argv:
        raise ValueError("spawn: argv is empty")
    problem = sandbox_problem()
    if problem is not None:
        if not allow_unsandboxed:
            raise SandboxUnavailable(unavailable_message(problem))
        return _spawn_unsandboxed(argv, limits, env, stdin, stdout, stderr, gateway, problem)
    relay = GatewayRelay(gateway) if gateway is not None else None
    spec = _spec(limits)
    if relay is not None and gateway is not None:
        spec |= {"gateway_port": gateway[1], "gateway_socket": f"{GATEWAY_DIR}/{SOCKET_NAME}"}
    command = [sys.executable, "-I", SHIM, json.dumps(spec), *argv]
    bwrap = bwrap_path()
    fd = args_file(bwrap_options(limits, env, relay.folder if relay else None, visible))
    cgroup = pids_cgroup(limits.nproc)
    try:
        popen = _popen(
            bwrap_command(bwrap or "bwrap", fd, command), {}, None, stdin, stdout, stderr, (fd,), cgroup
        )
    except BaseException:
        if relay is not None:
            relay.close()
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        os.close(fd)
    return Sandboxed(popen, limits, relay, None, cgroup)


def _spec(limits: Limits) -> dict[str, Any]:
    return {
        "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "nproc": limits.nproc, "nofile": limits.nofile,
        "fsize_mb": limits.fsize_mb, "gateway_port": None,
    }  # fmt: skip


def _spawn_unsandboxed(
    argv: Sequence[str], limits: Limits, env: Mapping[str, str], stdin: Stream, stdout: Stream, stderr: Stream,
    gateway: tuple[str, int] | None, problem: str,
) -> Sandboxed:  # fmt: skip
    """rlimits, a session of its own and an empty working folder; the host's network (a gateway
    is reached at its own address), files and processes. The warning is the point."""
    log.warning(
        "running an untrusted program WITHOUT a sandbox (sandbox.allow_unsandboxed is true): %s; "
        "it can read and write what the trainer can and reach the network", problem,
    )  # fmt: skip
    folder = tempfile.mkdtemp(prefix="rlt-unsandboxed-")
    command = [sys.executable, "-I", SHIM, json.dumps(_spec(limits)), *argv]
    try:
        popen = _popen(command, dict(env), folder, stdin, stdout, stderr, ())
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Sandboxed(popen, limits, None, folder)


def _popen(
    command: list[str], env: dict[str, str], cwd: str | None, stdin: Stream, stdout: Stream, stderr: Stream,
    pass_fds: tuple[int, ...], cgroup: PidsCgroup | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    return subprocess.Popen(
        command, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, pass_fds=pass_fds,
        start_new_session=True, preexec_fn=_child_setup(cgroup),  # noqa: PLW1509
    )  # fmt: skip
