"""``python -m rl_train.bench.lora``: each side's figures, measured in this process here (the
bench runs each side in a fresh one, for its peak memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench import lora


def test_a_lora_side_trains_keeps_and_syncs_less_and_times_its_generation_three_ways(tiny_model_dir: Path) -> None:
    full = lora.measure_side(str(tiny_model_dir), 0, steps=2)
    adapted = lora.measure_side(str(tiny_model_dir), 4, steps=2, targets=["q_proj", "v_proj"], link=("delta", "shm"), repeats=1, prompts=16)
    assert set(full) == set(lora.FIGURES) and set(adapted) == {*lora.FIGURES, *lora.GENERATION}
    assert 0 < adapted["trainable"] < full["trainable"] / 4
    assert adapted["state_mb"] < full["state_mb"] / 4  # adapters and their moments, no base weights
    assert 0 < adapted["sync_mb"] < full["sync_mb"] / 10  # the adapters alone (a delta of them at step 2)
    timed = ("sync_s", "step_s", *lora.GENERATION)
    assert min(adapted[name] for name in timed) > 0 and min(full["step_s"], full["sync_s"]) > 0


def test_the_learning_report_gives_steps_to_the_target_or_the_best_mean() -> None:
    from rl_train.bench import lora_learning
    from rl_train.bench.time_to_reward import Curve

    reached = Curve("full", 0, 32, rewards=[0.5] * 5 + [0.95] * 10, seconds=[float(s) for s in range(1, 16)])
    short = Curve("lora", 0, 32, rewards=[0.2] * 10 + [0.6] * 10, seconds=[2.0 * s for s in range(1, 21)])
    assert lora_learning.best_mean(reached) == pytest.approx(0.95) and lora_learning.best_mean(short) == pytest.approx(0.6)
    rows = lora_learning.format_report([reached, short]).splitlines()
    assert rows[3] == "| full | 0 | 15 | 14 | 14.0 | 0.950 | 1.00 | 0.0 |"  # 0.5 + 9 x 0.95 over 10 = 0.905
    assert rows[4] == "| lora | 0 | 20 | - | - | 0.600 | 2.00 | 0.0 |"
    import argparse

    args = argparse.Namespace(config=str(lora_learning.DEMO_CONFIG), rank=8, lora_lr=3e-3, lora_steps_factor=3,
                              lora_args=["actor.lora.alpha=8"], full_args=[])  # fmt: skip
    assert lora_learning.side_overrides(args, lora=False) == []
    assert lora_learning.side_overrides(args, lora=True) == [
        "actor.lora.rank=8", "actor.lr=0.003", "trainer.total_steps=300", "actor.lora.alpha=8"
    ]  # fmt: skip
