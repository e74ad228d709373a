"""What a sandboxed program may use (``Limits``) and the run's ``sandbox:`` config section."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from rl_train.algorithms.config import StrictModel

GRACE_S = 2.0
"""Past ``Limits.wall_s`` by this much, the whole sandbox is SIGKILLed from outside: time for a
program at its deadline to flush its output, and for a loaded machine to notice."""


@dataclass(frozen=True)
class Limits:
    """Per program. The rlimits are set inside the sandbox (so they count the sandbox's own
    processes, not the trainer's); the wall limit is kept from outside."""

    wall_s: float
    """Deadline in seconds; the whole sandbox is SIGKILLed at ``wall_s + GRACE_S``."""
    cpu_s: int = 60
    """RLIMIT_CPU, seconds of CPU per process."""
    memory_mb: int = 1024
    """RLIMIT_AS, MiB of address space per process."""
    nproc: int = 64
    """RLIMIT_NPROC: processes and threads of the sandbox's user."""
    nofile: int = 256
    """RLIMIT_NOFILE: open file descriptors per process."""
    fsize_mb: int = 64
    """RLIMIT_FSIZE: MiB, the largest file a process may write."""
    tmpfs_mb: int = 64
    """Size cap, MiB, of /tmp, the working folder and /dev/shm each (memory-backed)."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "nproc", "nofile", "fsize_mb", "tmpfs_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name}: got {getattr(self, name)}, must be at least 1")
        if not (self.wall_s > 0 and math.isfinite(self.wall_s)):
            raise ValueError(f"Limits.wall_s: got {self.wall_s}, must be a positive number of seconds")


class SandboxConfig(StrictModel):
    """``sandbox``: how untrusted programs (the ``python`` tool, agent commands) are run."""

    allow_unsandboxed: bool = False
    """Where bubblewrap cannot start, run untrusted programs anyway with rlimits and a process group of their own only (no namespaces, no read-only root): logs a warning on every run. False: refuse at start."""
    memory_mb: int = Field(1024, ge=64)
    """python tool: address space of each process, MiB (RLIMIT_AS)."""
    tmpfs_mb: int = Field(64, ge=1)
    """python tool: size of /tmp, the working folder and /dev/shm each, MiB (memory-backed)."""
    nproc: int = Field(32, ge=1)
    """python tool: processes and threads the program may have at once (RLIMIT_NPROC)."""
    nofile: int = Field(256, ge=16)
    """python tool: open file descriptors per process (RLIMIT_NOFILE)."""
    fsize_mb: int = Field(16, ge=1)
    """python tool: the largest file it may write, MiB (RLIMIT_FSIZE)."""
    max_output_bytes: int = Field(16 << 10, ge=256)
    """python tool: what the model reads of stdout and of stderr, bytes each; the rest is cut."""

    def tool_limits(self, timeout_s: float) -> Limits:
        """The limits of one python tool call of ``timeout_s`` seconds (CPU: the same, rounded up)."""
        return Limits(
            wall_s=timeout_s,
            cpu_s=math.ceil(timeout_s) + 1,
            memory_mb=self.memory_mb,
            nproc=self.nproc,
            nofile=self.nofile,
            fsize_mb=self.fsize_mb,
            tmpfs_mb=self.tmpfs_mb,
        )
