"""The demo task trained with the built-in tiny reward model alone (``configs/arith-rm-tiny.yaml``):
both the reward model's mean score and the exact-match rule, logged beside it and never
trained on, rise. The reward model is created by the run itself (``create_task``). ``STEPS``
steps at the config's peak learning rate held constant (the full config decays it over 100
steps, at 0.6x of the peak or more over the first 30; cut to 30 steps, the same schedule would
be at 0.1x from step 18 on).

One run of ``STEPS`` steps, phases called directly: select with ``-m slow``. The figures are in
``src/rl_train/bench/RESULTS.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_train.config import load_config
from rl_train.flows.train import run_training
from rl_train.storage.metrics import read_metrics

# 602-784 s under a load of 4-7 (the 30 steps themselves: about 40 s once the load fell)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
STEPS, WINDOW = 30, 5
RULE = "reward/arith/single_digit_sum/rule"


def test_the_reward_model_s_score_and_the_rule_s_both_rise(tmp_path: Path) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    config = load_config(
        REPO / "configs" / "arith-rm-tiny.yaml",
        [
            f"model.path={tmp_path / 'policy'}",
            f"reward.models.tiny_rm.path={tmp_path / 'tiny-rm'}",
            f"data.data_dir={tmp_path / 'data'}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"trainer.total_steps={STEPS}",
            "actor.lr_schedule=constant",
            "trainer.use_prefect=false",
            "trainer.val_every_steps=0",
            "checkpoint.every_steps=0",
        ],
    )
    rows = read_metrics(run_training(config)["run_dir"])
    assert len(rows) == STEPS
    rm, rule = [r["reward/mean"] for r in rows], [r[RULE] for r in rows]
    start, end = (lambda xs: sum(xs[:WINDOW]) / WINDOW), (lambda xs: sum(xs[-WINDOW:]) / WINDOW)
    print(f"RM score {start(rm):.3f} -> {end(rm):.3f}; rule {start(rule):.3f} -> {end(rule):.3f}")
    assert end(rm) > start(rm) + 0.1, rm
    assert end(rule) > start(rule) + 0.2 and end(rule) > 2 * start(rule), rule
    # the learned reward (a probability of being right) tracks the verifiable one: not hacked
    assert abs(end(rm) - end(rule)) < 0.1, (rm, rule)
