"""Starting a black-box agent as a process that can always be stopped (R-5.5).

An agent program is untrusted: it may hang, ignore SIGTERM, fork children, or read its own
command line back to whoever lists processes. So it is started in a session of its own (its
own process group) and ended by SIGKILL to the whole group, from outside, by the supervisor
(``gateway_runs``); it is never waited on without a deadline.

What it is told goes by environment, never argv (``/proc/<pid>/cmdline`` is readable by every
user of the host, the environment only by the process's own user): the gateway's URL in
``OPENAI_BASE_URL``, its session's token in ``OPENAI_API_KEY`` (the names the ``openai``
client reads by itself) and the prompt's text in ``RL_TRAIN_TASK``. The rest of the trainer's
environment (cloud credentials, Ray's addresses) is not passed on: only ``PATH``,
``PYTHONPATH`` and the locale, so that a Python agent finds its interpreter and packages.

The process reads nothing (stdin is ``/dev/null``); its stdout is dropped and its stderr goes
to an unlinked temporary file the trainer holds, whose last bytes explain a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from types import TracebackType
from typing import IO

BASE_URL_VAR = "OPENAI_BASE_URL"
API_KEY_VAR = "OPENAI_API_KEY"
TASK_VAR = "RL_TRAIN_TASK"
PASSED_ON = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ")
"""The trainer's variables an agent inherits; nothing else of its environment."""
STDERR_TAIL_BYTES = 2048
_POLL_S = 0.01


def agent_env(base_url: str, api_key: str, task: str) -> dict[str, str]:
    """The whole environment of an agent process: what it is told, and how to run at all."""
    inherited = {name: os.environ[name] for name in PASSED_ON if name in os.environ}
    return {**inherited, BASE_URL_VAR: base_url, API_KEY_VAR: api_key, TASK_VAR: task}


class AgentProcess:
    """An agent started as the leader of a new process group; ``kill`` ends the group.

    The leader is not reaped until the group has been killed (``os.waitid`` with ``WNOWAIT``
    sees it exit without reaping it), so its pid, the group's id, cannot be reused by an
    unrelated process while the group may still be signalled.
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile(prefix="rlt-agent-")  # noqa: SIM115 (closed in __exit__)
        try:
            self._popen = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                start_new_session=True, close_fds=True,
            )  # fmt: skip
        except BaseException:
            self._stderr.close()
            raise
        self.pid = self._popen.pid

    def wait(self, timeout_s: float) -> int | None:
        """The leader's exit code (minus the signal that killed it), or None while it runs."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._popen.returncode is not None:
                return self._popen.returncode
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0.0)))

    def kill(self) -> None:
        """SIGKILL every process still in the group (the leader too, if it runs)."""
        if self._popen.returncode is not None:
            return  # reaped: the group's id may belong to someone else by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def stderr_tail(self) -> str:
        """The last bytes the agent wrote to stderr (to explain a failure)."""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(size - STDERR_TAIL_BYTES, 0))
        return self._stderr.read().decode("utf-8", "replace").strip()

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        """Kill the group, reap the leader, drop the stderr file."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
        self._stderr.close()


def start_agent(argv: list[str], env: dict[str, str]) -> AgentProcess:
    """Start one agent; every agent process the trainer runs starts here."""
    return AgentProcess(argv, env)
