"""``reward.models.<name>``: a discriminative reward model (an HF sequence classifier), by name.

A config names a reward model here and routes data sources to that name in
``reward.by_data_source``. Loading the config imports neither torch nor transformers: the
entry only builds its ``RewardModel`` (``reward_model.py``) in the reward worker that scores
with it, which is where a directory that is no sequence classifier fails, at its start.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.reward.registry import check_reward

if TYPE_CHECKING:
    from rl_train.engines.reward.config import RewardSettings
    from rl_train.engines.reward.reward_model import RewardModel

DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class RewardModelConfig(StrictModel):
    holds_model: ClassVar[bool] = True
    """A sequence classifier on a device of its own (placement, R-2.6)."""
    path: str
    """HF directory of an AutoModelForSequenceClassification: config.json (a ...ForSequenceClassification architecture), its weights, and a fast tokenizer with a chat template."""
    create_task: str | None = None
    """Where path does not exist, first train the built-in tiny reward model there on this built-in task (as `rl-train init-reward-model --task` does, with run.seed), the way model.create_if_missing makes the policy; None: the directory must exist."""
    device: str = "cpu"
    """Torch device it scores on: cpu, cuda or cuda:<index>."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype on the device."""
    batch_size: int = Field(32, ge=1)
    """Trajectories per forward pass (right-padded to the longest of them)."""
    max_length: int = Field(2048, ge=8)
    """Tokens the model reads of one trajectory at most; a longer one loses the left of its prompt (then of its response), never the end of the response."""
    label_index: int = Field(0, ge=0)
    """Which output of the classifier is the reward's logit (0 for the usual one-output reward model)."""
    normalise: Literal["none", "affine", "sigmoid"] = "none"
    """The score from the logit: none (the logit), affine (scale * logit + shift) or sigmoid (sigmoid(scale * logit + shift), in (0, 1)); the logit is logged as the sub-score rm_logit."""
    scale: float = 1.0
    """affine and sigmoid normalisation: the logit's factor."""
    shift: float = 0.0
    """affine and sigmoid normalisation: added after scaling."""
    chat_template: str | None = None
    """A Jinja chat template used instead of the tokenizer's (a tokenizer without one needs it): it renders the prompt (user), the model's turns (assistant) and the tools' answers (tool)."""
    log_rule: str | None = None
    """A reward (registered name or 'package.module:attr') run beside the model and logged as the sub-score rule, never part of the score: to watch a learned reward against a verifiable one."""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE.fullmatch(value):
            raise ValueError(f"got {value!r}: a device is cpu, cuda or cuda:<index>")
        return value

    @field_validator("log_rule")
    @classmethod
    def _rule(cls, value: str | None) -> str | None:
        return None if value is None else check_reward(value)

    @field_validator("create_task")
    @classmethod
    def _task(cls, value: str | None) -> str | None:
        from rl_train.engines.reward.tiny_rm_data import RM_TASKS

        if value is not None and value not in RM_TASKS:
            raise ValueError(
                f"got {value!r}: the built-in reward model is trained on one of {', '.join(RM_TASKS)}"
            )
        return value

    def build(self, name: str, settings: RewardSettings) -> RewardModel:
        """The reward model, loaded on its device (``RewardModelError`` where ``path`` is no
        sequence classifier), with its ``log_rule`` reward built beside it."""
        from rl_train.engines.reward.registry import build_reward
        from rl_train.engines.reward.reward_model import RewardModel

        rule = build_reward(self.log_rule, settings) if self.log_rule else None
        return RewardModel(f"reward.models.{name}", self, rule)


def check_reward_models(models: Mapping[str, RewardModelConfig]) -> None:
    """Before a run starts: each reward model's directory exists (or is to be created) and is a
    sequence classifier (``FileNotFoundError`` / ``RewardModelError``, named by config path)."""
    from rl_train.engines.reward.reward_model import check_model_dir

    for name, entry in models.items():
        where = f"reward.models.{name}"
        if not Path(entry.path).exists():
            if entry.create_task is None:
                raise FileNotFoundError(
                    f"{where}.path {entry.path} does not exist: run `rl-train init-reward-model --out {entry.path}` "
                    f"or set {where}.create_task"
                )
            continue
        check_model_dir(entry.path, where)


def create_missing_reward_models(models: Mapping[str, RewardModelConfig], seed: int) -> None:
    """Train the built-in tiny reward model at each missing path that names a ``create_task``."""
    for name, entry in models.items():
        if entry.create_task is not None and not Path(entry.path).exists():
            print(
                f"creating the built-in tiny reward model reward.models.{name} at {entry.path} ...",
                file=sys.stderr,
            )
            from rl_train.engines.reward.tiny_rm import train_tiny_rm  # torch: only when needed

            train_tiny_rm(
                entry.path,
                task=entry.create_task,
                seed=seed,
                progress=lambda line: print(line, file=sys.stderr),
            )
