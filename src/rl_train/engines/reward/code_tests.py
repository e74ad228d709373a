"""``code_tests``: a response's Python code judged by the row's unit tests, run in the sandbox.

The code (the last fenced ```python block of the response, else its last fenced block, else
the whole text) and the row's tests (``extra[reward.code_tests.tests_field]``: a list of
snippets, each one test such as an ``assert`` line, or one test program) run in one sandboxed
interpreter (``engines.sandbox.run_python``: no network, no processes, time, memory and file
limits). A small harness runs the code, then each test under its own alarm
(``test_timeout_s``), and reports each verdict on a line of its own, tagged with a nonce, as
it goes; so a program killed at its deadline still has the verdicts it gave.

Whose failure is it (R-6.5)? The harness says ``started`` before it runs any of the model's
code. Before that line, every failure is the infrastructure's: a sandbox that cannot start,
a harness that crashed or did not start in time, and the sample is marked ``is_infra``.
After it, everything is the model's: code that does not compile, raises, loops past the
alarms, exhausts its memory or exits early fails the tests it did not pass (score 0 when it
passes none), never infra.

What this does not stop: the model's code runs in the harness's interpreter, so code written
to read the harness (its frames, its nonce, its output descriptor) could forge verdicts. The
sandbox bounds what such code can do to the machine, not what it can claim about its tests.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.sandbox import Limits, SandboxResult, SandboxUnavailable, require_sandbox, run_python

if TYPE_CHECKING:
    from rl_train.engines.reward.config import CodeTestsConfig, RewardSettings

HARNESS = r"""
import os, signal
_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the program's own prints go nowhere
_code, _tests, _limit_s, _nonce = PAYLOAD
class _TestTimeout(BaseException):
    pass
def _alarm(signum, frame):
    raise _TestTimeout()
signal.signal(signal.SIGALRM, _alarm)
def _say(*parts):
    _out.write(_nonce + " " + " ".join(parts) + "\n")
    _out.flush()
_scope = {"__name__": "solution"}
def _run(source, name):
    signal.setitimer(signal.ITIMER_REAL, _limit_s)
    try:
        exec(compile(source, name, "exec"), _scope)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
_say("started")
try:
    _run(_code, "<solution>")
except BaseException as error:
    _say("load_error", type(error).__name__)
    _tests = ()
for _i, _test in enumerate(_tests):
    try:
        _run(_test, "<test %d>" % _i)
        _say("pass", str(_i))
    except BaseException as error:
        _say("fail", str(_i), type(error).__name__)
_say("done")
"""
"""Run as the sandboxed program; ``PAYLOAD`` becomes the literal (code, tests, limit, nonce)."""

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = ("python", "py", "python3")

Runner = Callable[..., SandboxResult]
"""``run_python``'s signature: (code, limits, *, max_output_bytes, allow_unsandboxed)."""


def extract_code(response: str) -> str:
    """The code of a response: its last ```python block, else its last fenced block, else an
    unclosed ```python block's rest (a response cut at its length limit), else all of it."""
    blocks = _FENCE.findall(response)
    tagged = [body for tag, body in blocks if tag.lower() in PYTHON_TAGS]
    if tagged or blocks:
        return str((tagged or [body for _, body in blocks])[-1])
    opened = re.search(r"```[ \t]*(?:python3?|py)[^\n]*\n", response, re.IGNORECASE)
    return response[opened.end() :] if opened else response


def row_tests(trajectory: Trajectory, field: str) -> tuple[str, ...]:
    """The row's tests: a list of snippets, or one program (one test). A row without them is
    bad data, not a grader failure: it raises, naming the column."""
    tests = trajectory.extra.get(field)
    if isinstance(tests, str) and tests.strip():
        return (tests,)
    if isinstance(tests, tuple) and tests and all(isinstance(t, str) for t in tests):
        return tests
    raise ValueError(
        f"code_tests: a row of data_source {trajectory.data_source!r} has {field}={tests!r}; it needs a "
        f"non-empty list of test snippets or a test program in column {field!r} (reward.code_tests.tests_field)"
    )


class CodeTestsReward:
    """The fraction of the row's unit tests the response's code passes (or 1 only if all pass),
    run in the sandbox; sub-scores ``tests_passed`` and ``tests_total``."""

    def __init__(
        self, config: CodeTestsConfig, limits: Limits, allow_unsandboxed: bool = False, run: Runner = run_python
    ) -> None:
        self.config, self.limits, self.allow_unsandboxed, self.run = config, limits, allow_unsandboxed, run

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> CodeTestsReward:
        """Refuses (``SandboxUnavailable``) where no sandbox can start, unless the run allows
        running unsandboxed (``sandbox.allow_unsandboxed``)."""
        sandbox = settings.sandbox
        require_sandbox(["the code_tests reward"], sandbox.allow_unsandboxed)
        limits = sandbox.tool_limits(settings.reward.code_tests.timeout_s)
        return cls(settings.reward.code_tests, limits, sandbox.allow_unsandboxed)

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """Each trajectory's result, in order, ``reward.code_tests.max_parallel`` sandboxes at a
        time (each is a process of its own; the threads only wait on them)."""
        for trajectory in trajectories:  # bad data fails the batch before anything runs
            row_tests(trajectory, self.config.tests_field)
        if len(trajectories) <= 1 or self.config.max_parallel == 1:
            return [self(t) for t in trajectories]
        with ThreadPoolExecutor(min(self.config.max_parallel, len(trajectories)), "code-tests") as pool:
            return list(pool.map(self, trajectories))

    def __call__(self, trajectory: Trajectory) -> RewardResult:
        tests = row_tests(trajectory, self.config.tests_field)
        nonce = secrets.token_hex(16)
        payload = repr((extract_code(trajectory.response), tests, self.config.test_timeout_s, nonce))
        program = HARNESS.replace("PAYLOAD", payload, 1)
        try:
            ran = self.run(
                program,
                self.limits,
                max_output_bytes=self.config.max_output_bytes,
                allow_unsandboxed=self.allow_unsandboxed,
            )
        except (SandboxUnavailable, OSError) as error:
            return RewardResult.infra(f"sandbox did not start: {type(error).__name__}: {error}")
        return self.verdict(ran, nonce, len(tests))

    def verdict(self, ran: SandboxResult, nonce: str, num_tests: int) -> RewardResult:
        """The result of a run from its verdict lines (see the module docstring for whose
        failure is whose)."""
        said = [line.split()[1:] for line in ran.stdout.splitlines() if line.startswith(nonce + " ")]
        if ["started"] not in said:
            how = "timed out" if ran.timed_out else f"exited with code {ran.exit_code}"
            said_last = ran.stderr[-300:].strip()
            return RewardResult.infra(f"the test harness {how} before the code ran" + (f": {said_last}" if said_last else ""))
        passed = len({words[1] for words in said if len(words) == 2 and words[0] == "pass"} & _indices(num_tests))
        score = passed / num_tests if self.config.scoring == "fraction" else float(passed == num_tests)
        return RewardResult(score, {"tests_passed": float(passed), "tests_total": float(num_tests)})


def _indices(num_tests: int) -> set[str]:
    return {str(i) for i in range(num_tests)}

