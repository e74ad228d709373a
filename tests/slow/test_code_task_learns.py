"""The built-in code task (``configs/code-tiny.yaml``: the policy writes a tiny function's body,
judged by its unit tests in the real sandbox) learns from below 0.3 to at least 0.7 mean
training reward (first and last 5 steps) within the config's steps, through
``bench/code_task.py`` with the phases called directly. Select with ``-m slow``; the figures
are in ``bench/RESULTS.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench.code_task import END_AT_LEAST, START_BELOW, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_code_task_learns(tmp_path: Path) -> None:
    outcome = train(0, tmp_path, [])
    assert outcome.start < START_BELOW, outcome.rewards
    assert outcome.end >= END_AT_LEAST, outcome.rewards
