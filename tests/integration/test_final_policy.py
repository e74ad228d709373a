"""The end of a run writes its policy as an HF model directory (R-9.5) that ``transformers``
loads as it is, and that scores the validation reward the run reported for its last step."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_train.config import Config
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.router import RewardRouter
from rl_train.flows.train import run_training
from rl_train.storage.dataset import load_prompts
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


def test_the_final_policy_loads_with_transformers_and_scores_the_reported_val_reward(
    small_run_config: dict[str, Any], ray_local
) -> None:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(total_steps=2, val_every_steps=2, use_prefect=False)
    config = Config.model_validate(cfg)
    summary = run_training(config)
    reported = read_metrics(summary["run_dir"])[-1]["val/reward_mean"]

    policy = Path(summary["run_dir"], "policy")
    model = AutoModelForCausalLM.from_pretrained(policy).eval()  # plain transformers, nothing of ours
    tokenizer = AutoTokenizer.from_pretrained(policy)
    scores = []
    for row in load_prompts(config.data.resolved_val_files()):
        ids = [tokenizer.bos_token_id, *tokenizer.encode(row["prompt"], add_special_tokens=False)]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=config.rollout.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(ids) :].tolist()
        answer = out[: out.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in out else out
        text = tokenizer.decode(answer, skip_special_tokens=True)
        scores.append(RewardRouter().score([Trajectory.of_answer(row, text)])[0].score)
    assert sum(scores) / len(scores) == pytest.approx(reported, abs=1e-12)
