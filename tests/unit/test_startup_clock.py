"""The start-up clock: seconds since the process started, first mark wins, one report line."""

from __future__ import annotations

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
