"""Running a model's Python program with limits: time, memory, output, no network, no processes.

The program runs in a fresh interpreter (``python -I``: no user site, no environment
variables read) in a session of its own, in an empty temporary folder, fed on stdin. Limits:

- **time**: a wall-clock timeout kills the whole process group; CPU time is capped too;
- **memory**: the address space is capped (``RLIMIT_AS``): a large allocation fails with
  ``MemoryError`` inside the program;
- **output**: stdout and stderr go to files capped in size (``RLIMIT_FSIZE``: a write past the
  cap ends the program), and what is read back is cut to ``max_output_bytes``;
- **network and processes**: an audit hook, installed before the program runs and not
  removable by it, refuses sockets (connect, bind, send, name lookups), starting processes
  (subprocess, os.system, exec, spawn, fork) and ctypes; where the kernel allows, the program
  also gets a network namespace of its own with no interface but loopback;
- **files**: it starts in an empty temporary folder, removed afterwards, but can read what the
  user running the trainer can read: run training as an unprivileged user.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

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
CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


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


def _limits(timeout_s: float, memory_mb: int, output_mb: int) -> None:
    """In the child before exec (async-signal-safe calls only)."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    cpu = int(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_mb << 20, output_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if _LIBC is not None:
        _LIBC.unshare(CLONE_NEWNET)  # best effort: the audit hook refuses sockets either way


def run_python(
    code: str, timeout_s: float = 5.0, memory_mb: int = 512, max_output_bytes: int = 16 << 10, output_mb: int = 4
) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="rlt-sandbox-") as folder:
        out_path, err_path = Path(folder, "stdout"), Path(folder, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", GUARD],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=folder,
                env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
                preexec_fn=lambda: _limits(timeout_s, memory_mb, output_mb),  # noqa: PLW1509
            )
            timed_out = False
            try:
                process.communicate(code.encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        stdout, cut_out = _read(out_path, max_output_bytes)
        stderr, cut_err = _read(err_path, max_output_bytes)
        return SandboxResult(stdout, stderr, None if timed_out else process.returncode, timed_out, cut_out or cut_err)


def _read(path: Path, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) > limit
