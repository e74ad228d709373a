"""Starting a black-box agent as a sandboxed process that can always be stopped (R-5.5).

An agent program is untrusted: it may hang, ignore SIGTERM, fork children, read the trainer's
files or environment, or read its own command line back to whoever lists processes. So it runs
under the sandbox (``rl_train.engines.sandbox.spawn``: its own namespaces, a read-only root,
rlimits, only the environment given), where the one address it can reach is the gateway, at
127.0.0.1 and the gateway's own port; and it is ended by SIGKILL to its whole process group,
from outside, by the supervisor (``gateway_runs``), which never waits on it without a deadline.

What it is told goes by environment, never argv (``/proc/<pid>/cmdline`` is readable by every
user of the host, the environment only by the process's own user; the sandbox hands the
environment to bubblewrap in a memory file, not on its command line): the gateway's URL in
``OPENAI_BASE_URL``, its session's token in ``OPENAI_API_KEY`` (the names the ``openai``
client reads by itself) and the prompt's text in ``RL_TRAIN_TASK``. The rest of the trainer's
environment (cloud credentials, Ray's addresses) is not passed on: only ``PATH``,
``PYTHONPATH`` and the locale, so that a Python agent finds its interpreter and packages.

The process reads nothing (stdin is ``/dev/null``); its stdout is dropped and its stderr goes
to an unlinked temporary file the trainer holds (capped by the sandbox's file-size limit),
whose last bytes explain a failure.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO

import rl_train
from rl_train.engines.sandbox import Limits, Sandboxed, spawn

BASE_URL_VAR = "OPENAI_BASE_URL"
API_KEY_VAR = "OPENAI_API_KEY"
TASK_VAR = "RL_TRAIN_TASK"
PASSED_ON = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ")
"""The trainer's variables an agent inherits; nothing else of its environment."""
STDERR_TAIL_BYTES = 2048


def agent_env(base_url: str, api_key: str, task: str) -> dict[str, str]:
    """The whole environment of an agent process: what it is told, and how to run at all."""
    inherited = {name: os.environ[name] for name in PASSED_ON if name in os.environ}
    return {**inherited, BASE_URL_VAR: base_url, API_KEY_VAR: api_key, TASK_VAR: task}


def agent_limits(timeout_s: float, grace_s: float, memory_mb: int) -> Limits:
    """The sandbox's limits for an agent of ``timeout_s``: its own wall-clock backstop after the
    supervisor's kill (``timeout_s + grace_s``), CPU for all of that time, ``memory_mb`` of
    address space per process; the sandbox's defaults for the rest."""
    wall_s = timeout_s + grace_s
    return Limits(wall_s=wall_s, cpu_s=math.ceil(wall_s) + 1, memory_mb=memory_mb)


def python_paths() -> list[str]:
    """Where this trainer's Python code lives (its package, ``PYTHONPATH``): shown read-only
    in the sandbox even under a folder it hides (a home), so that an agent in Python, the
    built-in one included, imports what the trainer does."""
    package = Path(rl_train.__file__).resolve().parents[1]
    listed = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)]
    return sorted({str(package), *(str(Path(p).resolve()) for p in listed)})


class AgentProcess:
    """An agent in its sandbox; ``kill`` ends its whole process group (the sandbox with it)."""

    def __init__(self, argv: list[str], env: dict[str, str], limits: Limits, gateway: tuple[str, int], allow_unsandboxed: bool) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile(prefix="rlt-agent-")  # noqa: SIM115 (closed in __exit__)
        try:
            self._sandbox: Sandboxed = spawn(
                argv, limits=limits, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                gateway=gateway, allow_unsandboxed=allow_unsandboxed, visible=python_paths(),
            )  # fmt: skip
        except BaseException:
            self._stderr.close()
            raise
        self.pid = self._sandbox.pid

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code (negative: the signal that killed it), or None while it runs."""
        return self._sandbox.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole group."""
        self._sandbox.kill()

    def stderr_tail(self) -> str:
        """The last bytes the agent wrote to stderr (to explain a failure)."""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(size - STDERR_TAIL_BYTES, 0))
        return self._stderr.read().decode("utf-8", "replace").strip()

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        """Kill, reap and clean up the sandbox; drop the stderr file."""
        try:
            self._sandbox.close()
        finally:
            self._stderr.close()


def start_agent(
    argv: list[str], env: dict[str, str], limits: Limits, gateway: tuple[str, int], allow_unsandboxed: bool = False
) -> AgentProcess:
    """Start one agent; every agent process the trainer runs starts here. ``gateway`` (host,
    port): the one endpoint it reaches, at 127.0.0.1:port inside. Raises ``SandboxUnavailable``
    where no sandbox can start, unless ``allow_unsandboxed`` (``sandbox.allow_unsandboxed``)."""
    return AgentProcess(argv, env, limits, gateway, allow_unsandboxed)
