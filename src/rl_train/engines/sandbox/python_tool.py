"""``run_python``: a model's Python program in a sandbox, and what the model reads of it.

The program is fed on stdin to a fresh interpreter (``python -I``) in a sandbox (``spawn``).
Its output comes back through pipes the trainer holds, read on threads with a cap: past the
cap the pipe is closed (the program's next write fails) and the text is marked truncated. The
program never gets a path the trainer will open, so it cannot make the trainer block.

An audit hook refuses sockets, processes and ctypes with a readable error first: a courtesy
for the model, not a boundary (it can be switched off from inside; the sandbox is the
boundary).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO

from rl_train.engines.sandbox.config import GRACE_S, Limits
from rl_train.engines.sandbox.process import spawn

GUARD = r"""
import sys
BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.", "ctypes.", "_posixsubprocess")
def guard(event, args, blocked=BLOCKED):
    if event.startswith(blocked):
        raise PermissionError(f"sandbox: {event} is not allowed (no network, no processes)")
sys.addaudithook(guard)
source = sys.stdin.read()
exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})
"""
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
CHUNK_BYTES = 64 << 10


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool

    def observation(self) -> str:
        """What the model reads: the output, then how the program ended when it did not end well."""
        parts = [self.stdout]
        if self.stderr.strip():
            parts.append(f"[stderr]\n{self.stderr}")
        if self.timed_out:
            parts.append("[killed: time limit]")
        elif self.exit_code not in (0, None):
            parts.append(f"[exit code {self.exit_code}]")
        if self.truncated:
            parts.append("[output truncated]")
        return "\n".join(p for p in parts if p)


class CappedReader:
    """Reads a pipe on a thread of its own, keeping at most ``limit`` bytes; past them it closes
    the pipe, so a program printing forever is stopped by its own write error."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self.stream, self.limit = stream, limit
        self.data = bytearray()
        self.truncated = False
        self.thread = threading.Thread(target=self._read, name="sandbox-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.stream.read1(CHUNK_BYTES):  # type: ignore[attr-defined]
                self.data += chunk[: self.limit + 1 - len(self.data)]
                if len(self.data) > self.limit:
                    self.truncated = True
                    break
        except (OSError, ValueError):
            pass
        finally:
            self.stream.close()

    def text(self, timeout_s: float) -> str:
        self.thread.join(timeout_s)
        return bytes(self.data[: self.limit]).decode("utf-8", "replace")


def _feed(stream: IO[bytes], data: bytes) -> None:
    """Writes the program on a thread: a program that never reads stdin cannot block the trainer."""
    try:
        stream.write(data)
    except (OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def run_python(
    code: str, limits: Limits, *, max_output_bytes: int = 16 << 10, allow_unsandboxed: bool = False
) -> SandboxResult:
    """Runs ``code`` under ``limits``; returns by ``limits.wall_s`` plus a little, whatever it does.
    Raises ``SandboxUnavailable`` where no sandbox can start and ``allow_unsandboxed`` is false."""
    argv = [sys.executable, "-I", "-c", GUARD]
    pipe = subprocess.PIPE
    with spawn(
        argv,
        limits=limits,
        env=ENV,
        stdin=pipe,
        stdout=pipe,
        stderr=pipe,
        allow_unsandboxed=allow_unsandboxed,
    ) as process:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        threading.Thread(
            target=_feed, args=(process.stdin, code.encode()), name="sandbox-stdin", daemon=True
        ).start()
        out, err = (
            CappedReader(process.stdout, max_output_bytes),
            CappedReader(process.stderr, max_output_bytes),
        )
        exit_code = process.wait(limits.wall_s)
        timed_out = exit_code is None
        if timed_out:
            process.kill()
            process.wait(GRACE_S)
        stdout, stderr = out.text(GRACE_S), err.text(GRACE_S)
        timed_out = timed_out or process.timed_out
    return SandboxResult(
        stdout, stderr, None if timed_out else exit_code, timed_out, out.truncated or err.truncated
    )
