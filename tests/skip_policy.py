"""Which tests may skip: those of the ``gpu`` marker without a GPU and of the ``slow`` marker when
slow runs were not asked for. Any other skip fails its test.

A skip for another reason (a megatron-core that does not import, a missing libibverbs, a
weight-sync transport unavailable here) would let a green run hide code that never ran; here it
fails, with the test id and the reason, in CI and on a developer's machine alike (the reason
says what to install). An expected failure is no way round it: an ``xfail`` test fails too,
whether it failed as expected or passed. A module that skips itself while being collected
(``pytest.importorskip``) is a collection error. The markers' skip is the first mark pytest
reads, so a ``gpu`` test that also names a missing package reports the GPU as its reason.

``tests/conftest.py`` imports these hooks; ``tests/unit/test_skip_policy.py`` runs them on small
test files of its own.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

SLOW_REASON = "slow learning run: select with -m slow"
GPU_REASON = "needs a CUDA GPU (run scripts/gpu_check.sh on a GPU machine)"
MARKER_SKIP = pytest.StashKey[str]()
"""On an item the ``gpu`` or ``slow`` marker skips: the reason it is skipped with."""
ALLOWED = "only the gpu and slow markers may skip a test"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def slow_selected(config: pytest.Config) -> bool:
    """Slow learning runs (minutes each) run only when selected: ``-m slow`` or RL_TRAIN_RUN_SLOW=1."""
    return "slow" in (config.getoption("markexpr") or "") or os.environ.get("RL_TRAIN_RUN_SLOW") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow, has_gpu = slow_selected(config), None
    for item in items:
        reason = None
        if item.get_closest_marker("slow") is not None and not run_slow:
            reason = SLOW_REASON
        elif item.get_closest_marker("gpu") is not None:
            has_gpu = cuda_available() if has_gpu is None else has_gpu  # torch is imported only if asked
            reason = None if has_gpu else GPU_REASON
        if reason is not None:
            item.stash[MARKER_SKIP] = reason
            # first of the item's marks: pytest reads skipif marks in order, before skip and xfail
            item.add_marker(pytest.mark.skipif(True, reason=reason), append=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if MARKER_SKIP in item.stash:
        return report
    if hasattr(report, "wasxfail"):
        what = "xfailed" if report.skipped else "passed although marked xfail"
        message = f"{item.nodeid} {what} ({report.wasxfail or 'no reason given'}): {ALLOWED}, and none may xfail"
        del report.wasxfail
        report.outcome, report.longrepr = "failed", message
    elif report.skipped:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} was skipped ({skip_reason(report)}): {ALLOWED}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.nodeid} skipped itself while being collected ({skip_reason(report)}): {ALLOWED}; "
            "a module that needs an optional package imports it (installed by scripts/test.sh)"
        )
    return report


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason of a skip report: pytest keeps it as (path, line, "Skipped: <reason>")."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")
