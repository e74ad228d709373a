"""The code_tests reward in the real sandbox: passing, failing, looping and crashing code are the
model's failures (score, never infra); a sandbox that does not start or a harness that dies
before the code runs is infra (engines/reward/code_tests.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_train.cli import check_inputs
from rl_train.config import load_config
from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.code_tests import CodeTestsReward, extract_code
from rl_train.engines.reward.config import CodeTestsConfig, RewardConfig, RewardSettings
from rl_train.engines.sandbox import (
    GRACE_S,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailable,
    sandbox_problem,
)

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def reward(**code_tests: Any) -> CodeTestsReward:
    config = RewardConfig(code_tests=CodeTestsConfig(**{"timeout_s": 6.0, "test_timeout_s": 1.0, **code_tests}))
    return CodeTestsReward.from_settings(RewardSettings(config, SandboxConfig(memory_mb=512)))


def answer(response: str, tests: object = TESTS) -> Trajectory:
    row = {"prompt": "Write add(a, b).", "data_source": "code/add", "ground_truth": "", "tests": tests}
    return Trajectory.of_answer(row, response)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\nDone."


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH without bubblewrap (only a python), and the cached answer forgotten around it."""
    (tmp_path / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox_problem.cache_clear()
    yield
    sandbox_problem.cache_clear()


def test_extract_code_prefers_the_last_python_block() -> None:
    assert extract_code("a\n```python\nx = 1\n```\nb\n```py\nx = 2\n```") == "x = 2\n"
    assert extract_code("```\nx = 3\n```") == "x = 3\n"  # an untagged block when no python one
    assert extract_code("```text\nno\n```\n```python\nx = 4\n```\n```bash\nls\n```") == "x = 4\n"
    assert extract_code("cut short:\n```python\ndef f():\n    return 5") == "def f():\n    return 5"
    assert extract_code("def f(): return 6") == "def f(): return 6"  # no fence: all of it


def test_passing_and_failing_code_score_the_fraction_of_tests() -> None:
    right = reward()(answer(fenced("def add(a, b):\n    return a + b")))
    assert right == RewardResult(1.0, {"tests_passed": 3.0, "tests_total": 3.0})
    half = reward()(answer(fenced("def add(a, b):\n    return abs(a) + b")))  # fails add(-1, 1) only
    assert half == RewardResult(2 / 3, {"tests_passed": 2.0, "tests_total": 3.0})
    assert reward(scoring="all")(answer(fenced("def add(a, b):\n    return abs(a) + b"))).score == 0.0
    program = reward()(answer("def add(a, b):\n    return a + b", tests="assert add(2, 3) == 5\nprint('ok')"))
    assert program == RewardResult(1.0, {"tests_passed": 1.0, "tests_total": 1.0})  # one test program


@pytest.mark.parametrize(
    "code",
    [
        "def add(a, b) return a + b",  # does not compile
        "raise RuntimeError('boom')",  # raises on load
        "import os\nos._exit(3)",  # the process ends before any test
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",  # no network
        "x = bytearray(2 ** 31)",  # past the memory limit
        "print('x' * 10 ** 6)\ndef add(a, b):\n    return None",  # floods its output, fails every test
    ],
)
def test_broken_code_is_the_models_failure_not_infra(code: str) -> None:
    result = reward()(answer(fenced(code)))
    assert result == RewardResult(0.0, {"tests_passed": 0.0, "tests_total": 3.0})


def test_looping_code_fails_its_tests_within_the_limit() -> None:
    started = time.monotonic()
    looping = reward()(answer(fenced("def add(a, b):\n    while True:\n        pass")))
    assert looping == RewardResult(0.0, {"tests_passed": 0.0, "tests_total": 3.0})  # each test hit its alarm
    # Code that swallows the alarm loops to the run's deadline: the verdicts given before count.
    stubborn = (
        "import signal\ndef add(a, b):\n    if a < 0:\n        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "        while True:\n            pass\n    return a + b"
    )
    result = reward(timeout_s=3.0)(answer(fenced(stubborn)))
    assert result == RewardResult(1 / 3, {"tests_passed": 1.0, "tests_total": 3.0})  # add(1, 2), then stuck
    assert time.monotonic() - started < 3 * 1.0 + 3.0 + 2 * GRACE_S + 20  # generous: a loaded machine


def test_a_batch_runs_in_parallel_sandboxes_and_keeps_its_order() -> None:
    codes = ["def add(a, b):\n    return a + b", "def add(a, b) return", "def add(a, b):\n    return abs(a) + b"]
    results = reward(max_parallel=3).score_batch([answer(fenced(code)) for code in codes * 2])
    assert [r.score for r in results] == [1.0, 0.0, 2 / 3] * 2
    with pytest.raises(ValueError, match="has tests=None"):  # bad data fails the batch before any run
        reward().score_batch([answer(fenced(codes[0])), answer("x", tests=None)])


def test_a_crash_mid_tests_keeps_the_verdicts_before_it() -> None:
    code = "import os\ndef add(a, b):\n    if a < 0:\n        os._exit(1)\n    return a + b"
    assert reward()(answer(fenced(code))) == RewardResult(1 / 3, {"tests_passed": 1.0, "tests_total": 3.0})


def test_forged_verdict_lines_without_the_nonce_count_for_nothing() -> None:
    code = "import os\nfor i in range(3):\n    os.write(1, b'pass %d\\n' % i)\ndef add(a, b):\n    return None"
    assert reward()(answer(fenced(code))).score == 0.0


def test_a_sandbox_that_cannot_start_is_infra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built = reward()  # the start check passed; then bubblewrap goes away
    (tmp_path / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox_problem.cache_clear()
    try:
        result = built(answer(fenced("def add(a, b):\n    return a + b")))
    finally:
        sandbox_problem.cache_clear()
    assert result.is_infra and result.score == 0.0
    assert result.reason.startswith("sandbox did not start: SandboxUnavailable") and "bubblewrap" in result.reason


def test_a_harness_that_dies_or_stalls_before_the_code_runs_is_infra() -> None:
    def crashed(*args: Any, **kwargs: Any) -> SandboxResult:
        return SandboxResult("", "Fatal Python error: init", 1, False, False)

    def stalled(*args: Any, **kwargs: Any) -> SandboxResult:
        return SandboxResult("", "", None, True, False)

    def refused(*args: Any, **kwargs: Any) -> SandboxResult:
        raise OSError("bwrap: setting up uid map: Permission denied")

    limits = SandboxConfig().tool_limits(5.0)
    cases = {
        crashed: "the test harness exited with code 1 before the code ran: Fatal Python error: init",
        stalled: "the test harness timed out before the code ran",
        refused: "sandbox did not start: OSError: bwrap: setting up uid map: Permission denied",
    }
    for run, reason in cases.items():
        result = CodeTestsReward(CodeTestsConfig(), limits, run=run)(answer("def add(a, b): return a + b"))
        assert result == RewardResult.infra(reason)


def test_a_row_without_tests_is_bad_data() -> None:
    with pytest.raises(ValueError, match=r"has tests=\(\); it needs a non-empty list.*reward.code_tests.tests_field"):
        reward()(answer("x", tests=[]))


def test_without_a_sandbox_the_code_tests_reward_is_refused_at_start(no_bwrap: None, tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match=r"code_tests reward.*sandbox\.allow_unsandboxed: true"):
        reward()
    config = load_config(
        None,
        [f"run.output_dir={tmp_path / 'runs'}", f"data.data_dir={tmp_path / 'data'}", "reward.default=code_tests"],
    )
    with pytest.raises(SandboxUnavailable, match=r"the code_tests reward"):
        check_inputs(config)
