"""A short training run scored by a generative judge (configs/arith-judge-tiny.yaml's reward
section, the test's tiny model as judge and policy): the judge is built in the reward worker
(real Ray), decodes its verdicts there, and the run's metrics carry its sub-scores per data
source and its infra failures. Slow: 7.5 min on the loaded 2-core machine it was written on
(two reward-worker model loads and Ray's start dominate); the unit tests cover the judge itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sync_run import fit_sync_run

from rl_train.config import load_config
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_run_scored_by_the_judge_trains_and_logs_the_judges_metrics(small_run_config: dict[str, Any], ray_local) -> None:
    reward = load_config(str(REPO / "configs" / "arith-judge-tiny.yaml")).reward.model_dump(mode="json")
    reward["judges"]["judge"]["model_path"] = small_run_config["model"]["path"]
    trainer = fit_sync_run(small_run_config, 2, reward=reward)
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for step in metrics:
        raw = [v for k, v in step.items() if k.startswith("reward/arith") and k.endswith("/judge_raw")]
        infra = step["reward/infra_failures"]
        assert raw or infra > 0, step  # every sample got a verdict or was counted as infra
        assert all(0 <= v <= 9 for v in raw), raw  # the parser's scale: one digit
        assert 0.0 <= step["reward/mean"] <= 1.0 and "actor/loss" in step
