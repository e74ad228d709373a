"""A pids cgroup per sandbox, for where RLIMIT_NPROC does nothing: a trainer running as root.

The kernel does not apply RLIMIT_NPROC to a process whose user is root outside its user
namespace, and a sandbox started by root is that (its uid 65534 maps to root). So under root
each sandbox also gets a cgroup of its own with ``pids.max``: bubblewrap joins it before exec
and every process of the sandbox is counted there, whatever namespace it is in. Found where
root can make one: the cgroup v1 ``pids`` hierarchy, or a cgroup v2 folder of this process
whose ``pids`` controller is on for its children. Elsewhere (no such cgroup) the deadline is
the only bound on a fork bomb, and ``pids_cgroup`` says why once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)
V1_ROOT = Path("/sys/fs/cgroup/pids")
V2_ROOT = Path("/sys/fs/cgroup")
OVERHEAD_TASKS = 4
"""bubblewrap's two processes, the sandbox's init and the shim, on top of the program's own."""


@functools.cache
def _parent() -> Path | None:
    """The folder new pids cgroups go in, or None where root cannot make one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") and V1_ROOT.is_dir():
            candidate = V1_ROOT / path.lstrip("/")
            if os.access(candidate, os.W_OK):
                return candidate
        if controllers == "" and (V2_ROOT / "cgroup.controllers").exists():
            candidate = V2_ROOT / path.lstrip("/")
            with contextlib.suppress(OSError):
                if "pids" in (candidate / "cgroup.subtree_control").read_text().split() and os.access(
                    candidate, os.W_OK
                ):
                    return candidate
    log.warning(
        "no pids cgroup can be made here: as root, a sandboxed fork bomb is bounded only by its deadline"
    )
    return None


class PidsCgroup:
    """One sandbox's cgroup: ``join`` (in the child, before exec) moves the caller into it."""

    def __init__(self, folder: Path, max_tasks: int) -> None:
        self.folder = folder
        folder.mkdir()
        (folder / "pids.max").write_text(str(max_tasks))
        self._procs = os.open(folder / "cgroup.procs", os.O_WRONLY)

    def join(self) -> None:
        """In the child between fork and exec: one write, nothing that allocates."""
        os.write(self._procs, b"0")

    def remove(self, wait_s: float = 2.0) -> None:
        """Removes the cgroup once the sandbox's last process is gone (they die with bubblewrap)."""
        with contextlib.suppress(OSError):
            os.close(self._procs)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    log.warning("pids cgroup %s still busy; left behind", self.folder)
                    return
                time.sleep(0.02)


PREFIX = "rlt-sandbox-"
"""A sandbox's cgroup is ``<PREFIX><owner pid>-<random>``: a trainer SIGKILLed mid-sandbox leaves
its cgroups (empty once bubblewrap is gone), and the next one to make a cgroup removes them."""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(parent: Path) -> list[Path]:
    """Remove the empty sandbox cgroups under ``parent`` whose owner no longer runs; returns them."""
    removed = []
    for folder in parent.glob(f"{PREFIX}*"):
        pid, dash, _ = folder.name[len(PREFIX) :].partition("-")
        if not dash or not pid.isdigit() or _running(int(pid)):
            continue
        with contextlib.suppress(OSError):  # busy (a process still in it) or gone: left as it is
            folder.rmdir()
            removed.append(folder)
    return removed


def pids_cgroup(nproc: int) -> PidsCgroup | None:
    """A new cgroup capping ``nproc`` tasks plus the sandbox's own, when the trainer is root and
    one can be made; None otherwise (RLIMIT_NPROC does the work for any other user)."""
    if os.geteuid() != 0:
        return None
    parent = _parent()
    if parent is None:
        return None
    sweep_orphans(parent)
    try:
        return PidsCgroup(parent / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}", nproc + OVERHEAD_TASKS)
    except OSError as error:
        log.warning("could not make a pids cgroup under %s: %s", parent, error)
        return None
