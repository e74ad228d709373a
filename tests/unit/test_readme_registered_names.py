"""README documents every registered name, one line each (issue: a name nobody can look up is a trap)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rl_train.algorithms.advantage import ADV_ESTIMATORS
from rl_train.algorithms.aggregation import AGGREGATORS
from rl_train.algorithms.config import ROLLOUT_CORRECTION_PRESETS
from rl_train.algorithms.kl import KL_ESTIMATORS
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.thresholds import RS_OPTIONS
from rl_train.engines.agent.registry import AGENT_LOOPS
from rl_train.engines.agent.tools import TOOLS
from rl_train.engines.rollout.registry import ROLLOUT_ENGINES
from rl_train.engines.rollout.tool_env import TOOL_ENVS
from rl_train.engines.training.registry import TRAINING_ENGINES

README = Path(__file__).resolve().parents[2] / "README.md"
TABLES = {
    "Advantage estimators": ADV_ESTIMATORS.names(),
    "Policy losses": POLICY_LOSSES.names(),
    "KL estimators": KL_ESTIMATORS.names(),
    "Loss aggregation modes": AGGREGATORS.names(),
    "Rollout-correction presets": list(ROLLOUT_CORRECTION_PRESETS),
    "Rejection-sampling options": list(RS_OPTIONS),
    "Training engines": TRAINING_ENGINES.names(),
    "Rollout engines": ROLLOUT_ENGINES.names(),
    "Agent loops": AGENT_LOOPS.names(),
    "Agent tools": TOOLS.names(),
    "Tool environments": TOOL_ENVS.names(),
}


def documented(heading: str) -> list[str]:
    """Names of the ``- `name`: ...`` lines in the README paragraph that starts with ``heading``."""
    section = README.read_text(encoding="utf-8").split("## Registered names", 1)[1].split("\n## ", 1)[0]
    block = section.split(f"\n{heading}", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^- `([^`]+)`: \S", block, re.M)


@pytest.mark.parametrize("heading", list(TABLES))
def test_every_registered_name_has_one_readme_line(heading: str) -> None:
    assert sorted(documented(heading)) == sorted(TABLES[heading])
