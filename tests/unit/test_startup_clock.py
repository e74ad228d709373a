"""The start-up clock: seconds since the process started, first mark wins, one report line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train import startup_clock


def test_marks_count_from_the_process_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup_clock, "MARKS", {})
    startup_clock.mark("ray")
    first = startup_clock.MARKS["ray"]
    startup_clock.mark("ray")
    startup_clock.mark("workers")
    assert startup_clock.MARKS["ray"] == first > 0  # the process ran before this test
    assert startup_clock.report().startswith("start-up (s from process start): ray ")
    assert startup_clock.report().index("ray") < startup_clock.report().index("workers")


def test_the_report_is_asked_for_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(startup_clock.REPORT_ENV, raising=False)
    assert not startup_clock.report_requested()
    monkeypatch.setenv(startup_clock.REPORT_ENV, "1")
    assert startup_clock.report_requested()


def test_the_cpu_of_the_process_tree_counts_its_children_and_grandchildren() -> None:
    """A grandchild that burns about 0.5 s of CPU (under a child that only waits for it) is
    counted while it runs, and the report's second line carries the figure."""
    import subprocess
    import sys

    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\nprint('done', flush=True)\ninput()"
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        own = startup_clock.tree_cpu_seconds(child.pid)
        assert own >= 0.45
        assert startup_clock.tree_cpu_seconds() >= own  # this process is above them both
        cpu_line = startup_clock.report().splitlines()[1]
        assert cpu_line.startswith(startup_clock.CPU_REPORT) and float(cpu_line.rsplit(" ", 1)[1]) >= own
    finally:
        child.communicate("\n", timeout=30)


def test_the_report_by_process_names_each_process_and_its_own_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RL_TRAIN_STARTUP_REPORT=processes`` adds a line: each process of the tree by the module
    or script it runs, the one that burnt CPU with about what it burnt."""
    import subprocess
    import sys

    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nprint('done', flush=True)\ninput()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        rows = dict(startup_clock.tree_cpu_by_process(child.pid))
        assert list(rows) == [Path(sys.executable).name] and rows[Path(sys.executable).name] >= 0.35
        monkeypatch.setenv(startup_clock.REPORT_ENV, "processes")
        last = startup_clock.report().splitlines()[-1]
        assert last.startswith(startup_clock.PROCESS_REPORT)
        monkeypatch.setenv(startup_clock.REPORT_ENV, "1")
        assert startup_clock.PROCESS_REPORT not in startup_clock.report()
    finally:
        child.communicate("\n", timeout=30)
