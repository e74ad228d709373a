"""LoRA on the torch engine's policy, through PEFT (R-4.9).

PEFT wraps each targeted linear layer: the layer's own weight stays as loaded (frozen) and
two small matrices A and B are added, whose product, scaled, is the update. Only A and B
carry gradients, so Adam's moments and checkpoints are the adapters' size. The reference
model is the same network with the adapters switched off (PEFT's ``disable_adapter``), whose
output is the base layer's own, bit for bit.

A weight sync sends the adapters alone (``adapter_tensors``, named as ``weight_sync.adapters``
says) to a rollout engine that merges them itself, and HF-named full weights to any other:
``merged_weights`` gives each adapted weight as W + (alpha / r) B A under its base name,
everything else as loaded. ``save_adapter`` writes a
PEFT adapter directory (``PeftModel.from_pretrained(base, dir)`` loads it), with the base
model's path in its config.

Sharded (``actor.fsdp``, ``sharding.py``), the adapters are sharded like the base weights: each
reader here gathers what it reads (``full``), a collective every rank runs together, and a
checkpoint holds each rank's own shards (``local``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl_train.engines.training.lora_config import ALL_LINEAR, LoraSettings
from rl_train.engines.training.sharding import full, local
from rl_train.engines.weight_sync import adapters

ADAPTER = "default"
"""PEFT's name for the one adapter the engine trains."""
BASE_FILES = ("*.safetensors", "config.json")
"""What the base checksum covers: the weights and the architecture."""


def require_peft() -> Any:
    try:
        import peft
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("actor.lora needs PEFT: pip install 'rl-train[lora]'") from exc
    return peft


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The layer that maps hidden states to the vocabulary (often tied to the input embeddings)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else getattr(model, "lm_head", None)
    return head if isinstance(head, torch.nn.Module) else None


def linear_names(model: torch.nn.Module) -> list[str]:
    """The last name part of every linear layer but the output head, in model order, once each:
    the head is never adapted (tied to the embeddings, an adapter on it would change both)."""
    head = output_head(model)
    names: dict[str, None] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            names.setdefault(name.rsplit(".", 1)[-1], None)
    return list(names)


def resolve_targets(model: torch.nn.Module, targets: list[str] | str) -> list[str]:
    """``actor.lora.target_modules`` as names present in ``model``; a name that matches no linear
    layer is refused with the ones that exist (PEFT would adapt nothing, or fail later)."""
    present = linear_names(model)
    if targets == ALL_LINEAR:
        if not present:
            raise ValueError("actor.lora.target_modules 'all-linear': the policy has no linear layer to adapt")
        return present
    missing = [name for name in targets if name not in present]
    if missing:
        raise ValueError(
            f"actor.lora.target_modules: {missing} match no linear layer of the policy; its linear layers "
            f"are named {present} (the output head is never adapted), or use 'all-linear'"
        )
    return list(targets)


def apply_lora(model: torch.nn.Module, settings: LoraSettings, base_path: str | Path) -> Any:
    """``model`` wrapped by PEFT: fresh adapters (B = 0, so the policy starts as the base), or
    those of ``settings.init_from``; only the adapters require grad."""
    peft = require_peft()
    if settings.init_from is not None:
        folder = Path(settings.init_from)
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"actor.lora.init_from {str(folder)!r} is not a PEFT adapter directory (no adapter_config.json)"
            )
        wrapped = peft.PeftModel.from_pretrained(model, str(folder), is_trainable=True)
    else:
        config = peft.LoraConfig(
            r=settings.rank,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=resolve_targets(model, settings.target_modules),
            bias="none",
        )
        wrapped = peft.get_peft_model(model, config)
    wrapped.peft_config[ADAPTER].base_model_name_or_path = str(base_path)
    return wrapped


def adapter_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable (adapter) parameters, by their full names."""
    return [(name, param) for name, param in model.named_parameters() if param.requires_grad]


def _adapted_modules(wrapped: Any) -> dict[str, Any]:
    """Every adapted layer (PEFT's ``LoraLayer``) by its base weight's name, in model order."""
    from peft.tuners.lora import LoraLayer

    return {
        f"{name}.weight": module
        for name, module in wrapped.get_base_model().named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }


def _adapter_pair(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B (unscaled) of one adapted layer, whole (gathered when sharded: every rank calls
    this for the same layers in the same order)."""
    return full(module.lora_A[ADAPTER].weight.detach()), full(module.lora_B[ADAPTER].weight.detach())


@torch.no_grad()
def merged_weights(wrapped: Any, keep: dict[str, torch.Tensor] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy as HF-named full weights: each adapted weight W + (alpha / r) B A, the rest as
    loaded, under the base model's own names (what a rollout engine without LoRA loads). The
    merge is ``weight_sync.adapters.merged``, the one a rollout engine sent the adapters alone
    does, so both end on the same bits.

    Sharded (``actor.fsdp``), each tensor is gathered whole as it comes: a collective every rank
    runs in the same order. ``keep`` receives the gathered A and B under the wrapper's parameter
    names, so that a save writes the adapter directory without gathering them a second time."""
    layers = _adapted_modules(wrapped)
    for key, tensor in wrapped.get_base_model().state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        whole = full(tensor.detach())
        if name in layers:
            a, b = _adapter_pair(layers[name])
            whole = adapters.merged(whole, a, b * layers[name].scaling[ADAPTER])
            if keep is not None:
                module = adapters.PEFT_PREFIX + name.removesuffix(adapters.WEIGHT)
                keep[f"{module}.lora_A.{ADAPTER}.weight"] = a
                keep[f"{module}.lora_B.{ADAPTER}.weight"] = b
        yield name, whole


@torch.no_grad()
def adapter_tensors(wrapped: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """What an adapter-only weight sync sends: A and scaled B of every adapted layer, under the
    names of ``weight_sync.adapters`` (a new tensor for B, A as trained; gathered when sharded)."""
    for name, module in _adapted_modules(wrapped).items():
        a_name, b_name = adapters.adapter_names(name)
        a, b = _adapter_pair(module)
        yield a_name, a
        yield b_name, b * module.scaling[ADAPTER]


def save_adapter(wrapped: Any, out: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """A PEFT adapter directory at ``out``: adapter_config.json (the base model's path in it)
    and the adapters' weights as safetensors (``state``: their gathered copy, under the wrapper's
    parameter names, when the policy's own are sharded)."""
    # the embeddings are never adapted: PEFT's "auto" would reload the base's config to check
    extra = {} if state is None else {"state_dict": state}
    wrapped.save_pretrained(str(out), safe_serialization=True, save_embedding_layers=False, **extra)


def base_checksum(base_path: str | Path) -> str:
    """SHA-256 over the base model's weights and config: a checkpoint of adapters is only
    meaningful on the base it was trained on."""
    folder = Path(base_path)
    digest = hashlib.sha256()
    for path in sorted(p for pattern in BASE_FILES for p in folder.glob(pattern)):
        digest.update(path.name.encode())
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def merged_model(weights: dict[str, torch.Tensor], base_path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """A fresh copy of the base model holding ``weights`` (``merged_weights``: the policy stays
    as it is)."""
    from rl_train.engines.model.loading import load_model

    model = load_model(base_path, dtype=dtype)
    model.load_state_dict(weights)
    return model


def load_adapter_state(wrapped: Any, state: dict[str, object], base_path: str | Path, checksum: str) -> None:
    """The adapters of a LoRA checkpoint into ``wrapped``: refused when the checkpoint holds full
    weights, was trained on another base model, or has adapters of other names."""
    if "adapter" not in state:
        raise ValueError(
            "this checkpoint holds full weights, not LoRA adapters: actor.lora differs from the run that wrote it"
        )
    base: dict[str, str] = state["base"]  # type: ignore[assignment]
    if base["sha256"] != checksum:
        raise ValueError(
            f"this checkpoint's adapters were trained on the base model at {base['path']} "
            f"(sha256 {base['sha256'][:12]}...); {base_path} differs (sha256 {checksum[:12]}...)"
        )
    saved: dict[str, torch.Tensor] = state["adapter"]  # type: ignore[assignment]
    own = dict(adapter_parameters(wrapped))
    if set(saved) != set(own):
        raise ValueError(
            f"this checkpoint's adapters ({len(saved)} tensors) do not match actor.lora's ({len(own)}): "
            f"differing names {sorted(set(saved) ^ set(own))[:4]}"
        )
    with torch.no_grad():
        for name, param in own.items():
            local(param).copy_(saved[name])  # sharded: this rank's shard, as ``state_dict`` kept it
