"""BackgroundBuild: built on a thread once started, on the spot otherwise, errors re-raised."""

from __future__ import annotations

import threading

import pytest

from rl_train.engines.workers.background_build import BackgroundBuild


def test_get_without_start_builds_on_the_spot() -> None:
    calls: list[str] = []
    build = BackgroundBuild(lambda: calls.append(threading.current_thread().name) or 7)
    assert build.get() == 7 and build.get() == 7
    assert calls == [threading.current_thread().name]


def test_started_it_builds_on_a_thread_once() -> None:
    gate, calls = threading.Event(), []

    def slow() -> str:
        gate.wait(5)
        calls.append(threading.current_thread().name)
        return "ready"

    build = BackgroundBuild(slow, name="warm")
    build.start()
    build.start()
    gate.set()
    assert build.get() == "ready" and calls == ["warm"]


def test_an_error_of_the_build_is_raised_by_get() -> None:
    def broken() -> None:
        raise ModuleNotFoundError("no module named nope")

    build = BackgroundBuild(broken)
    build.start()
    with pytest.raises(ModuleNotFoundError, match="nope"):
        build.get()
    with pytest.raises(ModuleNotFoundError):
        build.get()
