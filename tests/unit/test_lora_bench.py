"""``python -m rl_train.bench.lora``: each side's figures, measured in this process here (the
bench runs each side in a fresh one, for its peak memory)."""

from __future__ import annotations

from pathlib import Path

from rl_train.bench import lora


def test_a_lora_side_trains_keeps_and_syncs_less_and_times_its_generation_three_ways(tiny_model_dir: Path) -> None:
    full = lora.measure_side(str(tiny_model_dir), 0, steps=2)
    adapted = lora.measure_side(str(tiny_model_dir), 4, steps=2, targets=["q_proj", "v_proj"], link=("delta", "shm"), repeats=1)
    assert set(full) == set(lora.FIGURES) and set(adapted) == {*lora.FIGURES, *lora.GENERATION}
    assert 0 < adapted["trainable"] < full["trainable"] / 4
    assert adapted["state_mb"] < full["state_mb"] / 4  # adapters and their moments, no base weights
    assert 0 < adapted["sync_mb"] < full["sync_mb"] / 10  # the adapters alone (a delta of them at step 2)
    timed = ("sync_s", "step_s", *lora.GENERATION)
    assert min(adapted[name] for name in timed) > 0 and min(full["step_s"], full["sync_s"]) > 0
