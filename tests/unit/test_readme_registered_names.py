"""README documents every registered name, one line each (issue: a name nobody can look up is a trap)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rl_train.registry import registries

README = Path(__file__).resolve().parents[2] / "README.md"
HEADINGS = {
    "Advantage estimators": "advantage estimator",
    "Policy losses": "policy loss",
    "KL estimators": "KL estimator",
    "Loss aggregation modes": "loss aggregation mode",
    "Rollout-correction presets": "rollout-correction preset",
    "Rejection-sampling options": "rejection-sampling option",
    "Training engines": "training engine",
    "Rollout engines": "rollout engine",
    "Agent loops": "agent loop",
    "Agent tools": "tool",
    "Tool environments": "tool environment",
}
"""README paragraph heading -> the registry's kind (``rl_train.registry.registries``)."""


def documented(heading: str) -> list[str]:
    """Names of the ``- `name`: ...`` lines in the README paragraph that starts with ``heading``."""
    section = README.read_text(encoding="utf-8").split("## Registered names", 1)[1].split("\n## ", 1)[0]
    block = section.split(f"\n{heading}", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^- `([^`]+)`: \S", block, re.M)


@pytest.mark.parametrize("heading", list(HEADINGS))
def test_every_registered_name_has_one_readme_line(heading: str) -> None:
    assert sorted(documented(heading)) == registries()[HEADINGS[heading]].names()
