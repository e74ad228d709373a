"""A LoRA run end to end (``actor.lora``): the KL reference is the policy with its adapters off
(no reference engine), checkpoints hold the adapters alone, a stopped run resumes to the very
adapters of one never stopped, and the saved adapter, loaded with ``peft`` on the base model,
scores the validation reward the run reported."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from rl_train.config import Config
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.router import RewardRouter
from rl_train.flows.registry import get_trainer_class
from rl_train.flows.train import run_training
from rl_train.storage.checkpoint import CheckpointStore
from rl_train.storage.dataset import load_prompts
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


class Stop(RuntimeError):
    """Stands in for a crash at the start of a step."""


@contextmanager
def stop_at(step: int) -> Iterator[None]:
    cls = get_trainer_class("sync")
    original = cls.on_step_begin

    def on_step_begin(self: Any, current: int) -> None:
        if current == step:
            raise Stop(f"stopped at step {current}")
        original(self, current)

    with mock.patch.object(cls, "on_step_begin", on_step_begin):
        yield


def _config(base: dict[str, Any], name: str, **trainer: Any) -> Config:
    cfg = copy.deepcopy(base)
    cfg["run"]["name"] = name
    cfg["trainer"].update({"use_prefect": False, "val_every_steps": 3, "total_steps": 3, **trainer})
    cfg["actor"].update(lr=3e-3, kl_loss=True, kl_loss_coef=0.05, lora={"rank": 4, "alpha": 8.0})
    cfg["checkpoint"] = {"every_steps": 2, "keep_last": 2}
    return Config.model_validate(cfg)


def _adapter(run_dir: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir, "policy", "adapter", "adapter_model.safetensors")))


def _val_reward_of_adapter(config: Config, base: str, adapter: Path) -> float:
    """Greedy answers of the base model under the saved adapter, loaded with plain peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter)).eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    scores = []
    for row in load_prompts(config.data.resolved_val_files()):
        ids = [tokenizer.bos_token_id, *tokenizer.encode(row["prompt"], add_special_tokens=False)]
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=config.rollout.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(ids) :].tolist()
        answer = out[: out.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in out else out
        scores.append(RewardRouter().score([Trajectory.of_answer(row, tokenizer.decode(answer, skip_special_tokens=True))])[0].score)
    return sum(scores) / len(scores)


def test_a_lora_run_resumes_bitwise_and_its_adapter_loads_with_peft(
    small_run_config: dict[str, Any], ray_local
) -> None:
    straight = run_training(_config(small_run_config, "lora"))
    rows = read_metrics(straight["run_dir"])
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert all("actor/kl" in m for m in rows)  # the reference pass ran: the base, adapters off

    engine = CheckpointStore(f"{straight['run_dir']}/checkpoints").read_state(2, "actor/rank-0/engine")
    assert "model" not in engine and engine["base"]["path"] == small_run_config["model"]["path"]
    assert all(".lora_A." in name or ".lora_B." in name for name in engine["adapter"])

    stopped = _config(small_run_config, "lora-stopped")
    with stop_at(3), pytest.raises(Stop):
        run_training(stopped)
    resumed = run_training(_config(small_run_config, "lora-stopped"))
    a, b = _adapter(straight["run_dir"]), _adapter(resumed["run_dir"])
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert any(k for k in a if ".lora_B." in k and a[k].abs().sum() > 0)  # the adapters trained
    adapter_bytes = sum(t.numel() * t.element_size() for t in a.values())
    assert all(m["weight_sync/bytes"] == adapter_bytes for m in rows)  # each sync: the adapters alone

    reported = rows[-1]["val/reward_mean"]
    adapter = Path(straight["run_dir"], "policy", "adapter")
    got = _val_reward_of_adapter(stopped, small_run_config["model"]["path"], adapter)
    assert got == pytest.approx(reported, abs=1e-12)
    assert not Path(straight["run_dir"], "policy", "config.json").exists()  # no merged model unless asked for


def test_rl_eval_scores_a_lora_checkpoint_as_peft_scores_its_adapter(
    small_run_config: dict[str, Any], ray_local, tmp_path: Path
) -> None:
    """The checkpoint's policy/ holds the adapter alone; ``rl-train eval`` serves it as the base
    with the adapter merged and scores what plain peft's greedy answers score."""
    from rl_train.flows.evaluate import evaluate_run

    config = _config(small_run_config, "lora-eval", total_steps=2, val_every_steps=0)
    run_dir = run_training(config)["run_dir"]
    outcome = evaluate_run(run_dir, step=2)
    scored = outcome.summary()
    policy = CheckpointStore(f"{run_dir}/checkpoints").download_dir(2, "policy", tmp_path / "policy")
    expected = _val_reward_of_adapter(config, small_run_config["model"]["path"], policy / "adapter")
    assert scored["reward_mean"]["val"] == pytest.approx(expected, abs=1e-12)
