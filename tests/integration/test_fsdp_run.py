"""A training run with the torch engine sharded over two ranks (``actor.fsdp``, FSDP2 over gloo,
real Ray actors): the ranks get uneven shards and still run their passes in step, each weight
sync gathers the whole model from both, the checkpoint keeps each rank's shards, and the final
policy loads with ``transformers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sync_run import fit_sync_run

from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


def test_a_sharded_run_trains_syncs_and_saves_the_whole_policy(small_run_config: dict[str, Any], ray_local) -> None:
    from transformers import AutoModelForCausalLM

    trainer = fit_sync_run(
        small_run_config,
        2,
        actor={"num_ranks": 2, "fsdp": True, "micro_batch_size": 5},
        checkpoint={"every_steps": 2},
    )
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/loss" in m and m["weight_sync/bytes"] > 0 for m in metrics), metrics
    policy = sorted(Path(trainer.run_dir).rglob("policy/config.json"))[-1].parent
    assert AutoModelForCausalLM.from_pretrained(policy).config.num_hidden_layers > 0


def test_a_sharded_lora_run_syncs_the_adapters_alone_and_saves_both_forms(
    small_run_config: dict[str, Any], ray_local
) -> None:
    """actor.lora on two FSDP ranks: rank 1 joins each adapter-only sync with the same gathers
    as rank 0's (``export_for_sync``), each sync carries the adapters' bytes alone, and the
    saved policy holds the merged model and the PEFT adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_train.engines.model.loading import load_model

    trainer = fit_sync_run(
        small_run_config,
        2,
        actor={"num_ranks": 2, "fsdp": True, "micro_batch_size": 5, "lora": {"rank": 4, "alpha": 8.0, "merged_export": True}},
        checkpoint={"every_steps": 2},
    )
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    policy = sorted(Path(trainer.run_dir).rglob("policy/config.json"))[-1].parent
    merged = AutoModelForCausalLM.from_pretrained(policy)
    full_bytes = sum(t.numel() * t.element_size() for t in merged.state_dict().values())
    assert all(0 < m["weight_sync/bytes"] < full_bytes / 4 for m in metrics), metrics
    adapted = PeftModel.from_pretrained(load_model(small_run_config["model"]["path"]), str(policy / "adapter"))
    assert any(".lora_B." in name and bool(p.abs().sum()) for name, p in adapted.named_parameters())
