"""Training runs on the megatron engine with the model split over two ranks (real Ray actors,
gloo): tensor parallel (both ranks hold half of every layer) and pipeline parallel (each holds
half of the layers). Both ranks train on the same batch shard; every weight sync and the saved
policy gather the whole model from both ranks (rank 0 sends, rank 1 joins). The run trains,
checkpoints, and its final policy loads with ``transformers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import pytest
from sync_run import fit_sync_run

from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("split", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_a_run_with_the_model_split_over_two_ranks_trains_and_saves_the_whole_policy(
    small_run_config: dict[str, Any], ray_local, split: dict[str, int]
) -> None:
    from transformers import AutoModelForCausalLM

    trainer = fit_sync_run(
        small_run_config,
        2,
        actor={"engine": "megatron", "num_ranks": 2, "megatron": split},
        checkpoint={"every_steps": 2},
    )
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/loss" in m and m["weight_sync/bytes"] > 0 for m in metrics), metrics
    policies = sorted(Path(trainer.run_dir).rglob("policy/config.json"))
    assert policies, "the checkpoint holds no policy"
    model = AutoModelForCausalLM.from_pretrained(policies[-1].parent)
    assert model.config.num_hidden_layers > 0


@pytest.mark.parametrize("replay", ["r2", "r3"])
def test_an_moe_run_routes_its_training_passes_by_recorded_experts(
    small_run_config: dict[str, Any], tiny_moe_dir: Path, ray_local, replay: str
) -> None:
    """Router replay in a run. R2: the old_log_prob phase records each token's experts on the
    record (``routes``: prompt and response, every MoE layer, top k), the update routes by
    them. R3: rollout records them, and old_log_prob and the update route by them."""
    small_run_config["model"]["path"] = str(tiny_moe_dir)
    trainer = fit_sync_run(small_run_config, 2, actor={"engine": "megatron", "router_replay": replay})
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2] and all("actor/loss" in m for m in metrics)
    assert all(m["actor/router_replay_tokens"] > 0 for m in metrics), metrics
