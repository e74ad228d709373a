"""What a killed run leaves behind: its processes (by session id) and its shared memory.

The crash harness starts each run in a session of its own (``start_new_session``), so Ray's
gcs, raylet and workers, which ``ray.init`` starts as the driver's descendants, carry the
run's session id. A kill of the process group should take them all; anything of that session
still alive afterwards, or anything that names the run's Ray temp dir from outside it (a
process that left the session), has escaped, and is reported, then killed by its pid.

Shared memory is attributed by observation: the harness records the ``/dev/shm`` files that
the run's processes map or hold open while they live; those still present once every process
of the run is gone were left by it. Other tests on the machine may create and remove
``/dev/shm`` files meanwhile: only files seen in a run's own processes count as the run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

SHM = Path("/dev/shm")
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    session: int
    group: int
    state: str
    cmdline: str

    def describe(self) -> str:
        return f"pid {self.pid} (sid {self.session}, pgid {self.group}, {self.state}): {self.cmdline[:160]}"


def read_process(pid: int) -> ProcessInfo | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return ProcessInfo(pid, int(fields[3]), int(fields[2]), fields[0], cmdline.strip())


def live_processes() -> list[ProcessInfo]:
    """Every process but zombies (a zombie holds nothing and waits only to be reaped)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = read_process(int(entry.name))
            if info is not None and info.state != "Z":
                found.append(info)
    return found


def run_processes(session: int, marker: str) -> list[ProcessInfo]:
    """The live processes of session ``session``, and any other whose command line names ``marker``."""
    me = os.getpid()
    return [p for p in live_processes() if p.pid != me and (p.session == session or marker in p.cmdline)]


def kill_session(session: int, marker: str) -> None:
    """SIGKILL every live process of the run (``run_processes``) now."""
    for process in run_processes(session, marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


def reap_run(session: int, marker: str, grace_seconds: float = 10.0) -> list[ProcessInfo]:
    """Wait up to ``grace_seconds`` for the run's processes to exit; kill and return the survivors."""
    deadline = time.monotonic() + grace_seconds
    survivors = run_processes(session, marker)
    while survivors and time.monotonic() < deadline:
        time.sleep(0.2)
        survivors = run_processes(session, marker)
    for process in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    return survivors


def shm_files() -> set[str]:
    try:
        return {entry.name for entry in SHM.iterdir()}
    except FileNotFoundError:
        return set()


def shm_in_use(pids: list[int]) -> set[str]:
    """The ``/dev/shm`` files (still linked) that ``pids`` map or hold open."""
    names: set[str] = set()
    prefix = f"{SHM}/"
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in (PROC / str(pid) / "maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(prefix) and not path.endswith("(deleted)"):
                    names.add(path[len(prefix) :])
        with contextlib.suppress(OSError):
            for fd in (PROC / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(prefix) and not target.endswith("(deleted)"):
                        names.add(target[len(prefix) :])
    return names


def remove_shm(names: set[str]) -> None:
    """Delete leftovers once recorded, so that one leaking run does not fill the machine's memory."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (SHM / name).unlink()
