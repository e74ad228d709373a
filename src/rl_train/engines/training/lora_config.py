"""``actor.lora.*``: low-rank adapters on the torch engine's policy (R-4.9), through PEFT."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rl_train.algorithms.config import StrictModel

ALL_LINEAR: Literal["all-linear"] = "all-linear"


class LoraSettings(StrictModel):
    """Only the adapters train (and hold Adam's moments); the base weights stay as loaded, and
    the reference model is the base with the adapters switched off (no second engine)."""

    rank: int = Field(8, ge=1)
    """The adapters' rank r: each adapted weight W gets W + (alpha / r) B A, with B [out, r], A [r, in]."""
    alpha: float = Field(16.0, gt=0)
    """The adapters' scale numerator (alpha / rank multiplies B A)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input in training passes (0: the update is a pure function of the batch)."""
    target_modules: list[str] | Literal["all-linear"] = ALL_LINEAR
    """Module names (suffixes, as PEFT matches them: q_proj, v_proj, ...) to adapt, or all-linear: every linear layer but the output head. Names that match no module of the policy are refused when the engine is built, with the policy's linear modules listed."""
    sync: Literal["adapter", "merged"] = "adapter"
    """What a weight sync sends: adapter (the adapters alone, megabytes where the model is gigabytes) to a rollout engine that serves them, else the merged full weights (with a line saying so); merged: always the merged full weights."""
    merged_export: bool = False
    """Also write the merged full model (an HF directory) where the policy is saved: the run's policy/ and each checkpoint's policy snapshot. The adapter alone is always written, in policy/adapter/ (policy/ then loads as its base with the adapter merged)."""
    init_from: str | None = None
    """A PEFT adapter directory (adapter_config.json + weights) to start from instead of a fresh adapter (B = 0); its rank and targets are the directory's."""

    @field_validator("target_modules")
    @classmethod
    def _names(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and (not value or any(not name.strip() for name in value)):
            raise ValueError(f"actor.lora.target_modules: got {value!r}; give module names (q_proj, ...) or 'all-linear'")
        return value
