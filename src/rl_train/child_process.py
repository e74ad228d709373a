"""Servers a process starts as children, and how they never outlive it (Linux).

``own_session_ended_with_parent`` runs in the child before exec: a session (and process group)
of its own, so that stopping it can end its whole tree and a Ctrl-C in the terminal reaches
only the parent, which then stops it in order; and SIGTERM when the thread that started it
dies, even by SIGKILL, so that no server and no port is left behind. Start such children from
a thread that lives as long as they should (the main thread, an actor's): the parent-death
signal follows the starting thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def own_session_ended_with_parent() -> None:
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (bound and released: another process could take it first)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def proc_stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 on), or None when the
    process is gone (Linux). Index 11/12 are utime/stime, 13/14 cutime/cstime, 19 the start
    time in clock ticks since boot."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_children(pid: int) -> list[int]:
    """The pids of ``pid``'s children, over all its threads (Linux ``/proc``; [] when gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as children:
                kids += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return kids
