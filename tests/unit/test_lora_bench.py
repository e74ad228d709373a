"""``python -m rl_train.bench.lora``: each side's figures, measured in this process here (the
bench runs each side in a fresh one, for its peak memory)."""

from __future__ import annotations

from pathlib import Path

from rl_train.bench import lora


def test_a_lora_side_trains_fewer_parameters_keeps_less_state_and_syncs_the_merged_weights(tiny_model_dir: Path) -> None:
    full = lora.measure_side(str(tiny_model_dir), 0, steps=1)
    adapted = lora.measure_side(str(tiny_model_dir), 4, steps=1)
    assert set(full) == set(adapted) == set(lora.FIGURES)
    assert 0 < adapted["trainable"] < full["trainable"] / 4
    assert adapted["state_mb"] < full["state_mb"] / 4  # adapters and their moments, no base weights
    assert adapted["sync_mb"] == full["sync_mb"]  # merged full weights, every name
    assert min(adapted["step_s"], full["step_s"], adapted["export_s"], full["export_s"]) > 0
