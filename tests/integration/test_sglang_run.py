"""A training run whose rollout replica is the sglang backend, attached to the sglang-compatible
CPU server (real Ray actors, HTTP between the replica and the server, weights pushed to the
server over a gloo group each step). The server answers one generate call with a malformed
body: the replica raises a clear error, the step's groups are evicted and refilled, and every
step completes."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from rl_train.config import Config, apply_mode_defaults
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


def test_a_sync_run_on_sglang_survives_a_malformed_answer(
    small_run_config: dict[str, Any], sglang_server: str, sglang_options: dict[str, Any], ray_local
) -> None:
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode="sync", use_prefect=False, val_every_steps=0)
    data["rollout"].update(engine="sglang", sglang={**sglang_options, "weight_update": "distributed"})
    data["replay"] = {"refill_failed_groups": True}
    apply_mode_defaults(data)
    # Step 1's generate call passes; step 2's gets a body without meta_info.
    httpx.post(f"{sglang_server}/test/fault", json={"mode": "malformed", "skip": 1, "times": 1}).raise_for_status()
    trainer = get_trainer_class("sync")(Config.model_validate(data))
    history = trainer.fit()
    assert len(history) == 3
    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/generation_errors"] for m in metrics] == [0.0, 1.0, 0.0]
    assert [m["replay/evicted_failure"] for m in metrics] == [0.0, 8.0, 0.0]
    assert all("actor/loss" in m for m in metrics)
    # The refill of step 2's eight evicted groups was a generate call of its own.
    assert httpx.get(f"{sglang_server}/test/state").json()["calls"]["/generate"] == 4


def test_a_lora_run_on_sglang_syncs_the_adapters_alone(
    small_run_config: dict[str, Any], sglang_server: str, sglang_options: dict[str, Any], ray_local
) -> None:
    """``actor.lora`` with the sglang backend: each step's sync is an adapter folder the server
    loads by name (the config filled ``rollout.sglang.lora``), every later generate names the
    newest, the previous one is unloaded each time, and the run's end unloads the last."""
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode="sync", use_prefect=False, val_every_steps=0)
    data["rollout"].update(engine="sglang", sglang=dict(sglang_options))
    data["actor"].update(lora={"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]})
    apply_mode_defaults(data)
    config = Config.model_validate(data)
    assert config.rollout.sglang.lora is not None and config.rollout.sglang.lora.max_rank == 4
    before_state = httpx.get(f"{sglang_server}/test/state").json()
    before = before_state["checked"]
    history = get_trainer_class("sync")(config).fit()
    assert len(history) == 3
    state = httpx.get(f"{sglang_server}/test/state").json()
    checked = {name: count - before.get(name, 0) for name, count in state["checked"].items()}
    assert checked.get("/update_weights_from_disk", 0) == 0  # no full weights crossed
    assert checked.get("/update_weights_from_distributed", 0) == 0
    assert checked["/load_lora_adapter"] >= 2 and state["lora"]["loaded"] == []
    named = [name for name in state["lora"]["requests"] if name not in ("base", *before_state["lora"]["requests"])]
    assert len(named) >= 2 and all(name.endswith("-lora") for name in named)  # steps 2 and 3 each its own
