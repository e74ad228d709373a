"""Adapter-only weight sync (``actor.lora``): the names LoRA adapters travel under, and the merge.

With LoRA only the adapters change, so a sync carries them alone. For an adapted weight
``<module>.weight`` of the base model it carries two tensors:

- ``<module>.lora_A.weight``: A, [r, in];
- ``<module>.lora_B.weight``: B already multiplied by the adapter's scale (alpha / r), [out, r].

A rollout engine serves W0 + B A (``merged``), W0 being the base model's own weight. These
names are the keys of a PEFT adapter file without its ``base_model.model.`` prefix, so an
engine that loads PEFT adapters (sglang) writes them under that prefix with ``lora_alpha``
equal to the rank. Every transport carries them as any other named tensors; ``delta``
diffs them as any other.

The training side's merged export (``export_weights`` of a LoRA engine) uses the same
``merged``, so a rollout engine ends on the same bits whichever of the two it was sent.

Torch-free: the driver reads the names without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_train.engines.rollout.registry import loads_lora_adapters

if TYPE_CHECKING:
    import torch

    from rl_train.engines.training.lora_config import LoraSettings

PARTS = ("lora_A", "lora_B")
WEIGHT = ".weight"
PEFT_PREFIX = "base_model.model."
"""What a PEFT adapter file puts before these names."""


def adapter_names(weight_name: str) -> tuple[str, str]:
    """The names of A and (scaled) B for the base weight ``weight_name`` (``<module>.weight``)."""
    if not weight_name.endswith(WEIGHT):
        raise ValueError(f"an adapted weight's name ends in {WEIGHT!r}; got {weight_name!r}")
    module = weight_name[: -len(WEIGHT)]
    return f"{module}.{PARTS[0]}{WEIGHT}", f"{module}.{PARTS[1]}{WEIGHT}"


def split_adapter_name(name: str) -> tuple[str, str] | None:
    """(base weight name, ``lora_A`` or ``lora_B``) for an adapter tensor's name; None for any other."""
    if not name.endswith(WEIGHT):
        return None
    module, _, part = name[: -len(WEIGHT)].rpartition(".")
    if part not in PARTS or not module:
        return None
    return f"{module}{WEIGHT}", part


def merged(base: torch.Tensor, a: torch.Tensor, b_scaled: torch.Tensor) -> torch.Tensor:
    """W0 + B A, summed in the adapters' dtype and rounded once to the base weight's: a bf16
    rollout copy of an fp32-trained base ends on the bits of the fp32 merge cast to bf16."""
    return (base.to(a.dtype) + b_scaled @ a).to(base.dtype)


def sends_adapters(lora: LoraSettings | None, rollout_engine: str) -> bool:
    """Whether a weight sync sends the adapters alone: LoRA is on, ``actor.lora.sync`` asks for
    it, and the rollout engine serves adapters."""
    return lora is not None and lora.sync == "adapter" and loads_lora_adapters(rollout_engine)


def merged_sync_note(lora: LoraSettings | None, rollout_engine: str) -> str | None:
    """The line a run prints when LoRA adapters are asked to sync alone but the rollout engine
    cannot serve them (it gets the merged full weights instead); None otherwise."""
    if lora is None or lora.sync != "adapter" or loads_lora_adapters(rollout_engine):
        return None
    return (
        f"actor.lora: rollout engine {rollout_engine!r} does not serve LoRA adapters, so each weight sync "
        "sends the merged full weights (set actor.lora.sync: merged to say so and silence this line)"
    )
