"""When each part of a run's start-up was ready, in seconds from its process's start.

``mark(name)`` records the first time a part is ready; ``report()`` is one line of them, which
``rl-train train`` prints to stderr after the first step when ``RL_TRAIN_STARTUP_REPORT=1``
(the start-up bench reads it). The clock starts when the process does (Linux's
``/proc/self/stat``), so the interpreter's own start and the first imports are counted.
"""

from __future__ import annotations

import os
import time

REPORT_ENV = "RL_TRAIN_STARTUP_REPORT"
MARKS: dict[str, float] = {}


def _process_start_offset() -> float:
    """Seconds the process had run when this module was imported (0 where unknown)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            now = float(uptime.read().split()[0])
        return max(now - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


_ORIGIN = time.perf_counter() - _process_start_offset()


def since_start() -> float:
    return time.perf_counter() - _ORIGIN


def mark(name: str) -> None:
    MARKS.setdefault(name, since_start())


def report() -> str:
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(MARKS.items(), key=lambda kv: kv[1]))
    lines = [f"start-up (s from process start): {parts}", f"{CPU_REPORT} {tree_cpu_seconds():.2f}"]
    if os.environ.get(REPORT_ENV, "") == "processes":
        shares = ", ".join(f"{name} {seconds:.2f}" for name, seconds in tree_cpu_by_process())
        lines.append(f"{PROCESS_REPORT} {shares}")
    return "\n".join(lines)


PROCESS_REPORT = "start-up CPU by process (s):"
"""The third line of ``report`` when ``RL_TRAIN_STARTUP_REPORT=processes``: each live process's
own CPU seconds (user + system), named by its command line, largest first."""


def process_name(pid: int) -> str:
    """A short name for ``pid``: Ray's actor title, else the script or module it runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = [a.decode(errors="replace") for a in cmdline.read().split(b"\0") if a]
    except OSError:
        return str(pid)
    if not argv:
        return str(pid)
    if argv[0].startswith("ray::"):
        return argv[0].split()[0]
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    scripts = [a for a in argv[1:] if a.endswith(".py")]
    return os.path.basename(scripts[0] if scripts else argv[0])


def _tree_stats(pid: int | None) -> list[tuple[int, list[str]]]:
    """(pid, its ``/proc`` stat fields) for ``pid`` (this process) and each live process under it."""
    from rl_train.child_process import proc_children, proc_stat_fields

    found, pending, seen = [], [os.getpid() if pid is None else pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        fields = proc_stat_fields(current)
        if fields is not None:
            found.append((current, fields))
            pending += proc_children(current)
    return found


def tree_cpu_by_process(pid: int | None = None) -> list[tuple[str, float]]:
    """(name, own CPU seconds) for ``pid`` (this process) and each live process under it."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = [(process_name(p), (int(f[11]) + int(f[12])) / tick) for p, f in _tree_stats(pid)]
    return sorted(rows, key=lambda row: -row[1])


CPU_REPORT = "start-up CPU (s, this process and every process under it):"
"""The second line of ``report``: on a machine of few cores, start-up is CPU-bound, and its CPU
seconds are a steadier figure than its wall time when other work shares the machine."""


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of ``pid`` (this process) and of every process under it, alive
    or ended and waited for (Linux ``/proc``; 0 where unknown). A local Ray's processes,
    its workers among them, and Prefect's temporary API server are all under the driver."""
    ticks = sum(int(f[i]) for _, f in _tree_stats(pid) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def report_requested() -> bool:
    return os.environ.get(REPORT_ENV, "") not in ("", "0")
