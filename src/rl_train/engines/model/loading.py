"""Loading a policy from an HF-format directory: its model and its tokenizer.

``impl`` chooses the model's implementation (``model.impl`` in the config):

- ``native``: ``engines/model/native.py``, plain torch, for the dense Qwen2 / Llama models it
  covers; it starts in milliseconds instead of transformers' seconds and decodes faster;
- ``transformers``: transformers' own model class, for anything;
- ``auto`` (the default): native where it covers the model, transformers otherwise.

Both have the same parameter names, so weights, checkpoints and weight sync do not care
which one a worker uses; ``save_policy`` writes an HF directory either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch

from rl_train.engines.model.tokenizer import load_tokenizer

ModelImpl = Literal["auto", "native", "transformers"]
MODEL_IMPLS: tuple[str, ...] = ("auto", "native", "transformers")


def resolve_impl(path: str | Path, impl: str = "auto") -> str:
    """``native`` or ``transformers`` for the model at ``path``; ``native`` asked of a model it
    does not cover is an error that says why."""
    from rl_train.engines.model.native import read_hf_config, unsupported_reason

    if impl not in MODEL_IMPLS:
        raise ValueError(f"model.impl: got {impl!r}; allowed: {', '.join(MODEL_IMPLS)}")
    if impl == "transformers":
        return impl
    folder = Path(path)
    reason = unsupported_reason(read_hf_config(folder)) if (folder / "config.json").is_file() else "no config.json"
    if reason is None and not any(folder.glob("*.safetensors")):
        reason = "no *.safetensors weights"
    if reason is None:
        return "native"
    if impl == "native":
        raise ValueError(f"model.impl=native: {folder} is not a model it covers: {reason}; use model.impl=auto")
    return "transformers"


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_folder(path: str | Path) -> Path | None:
    """The PEFT adapter folder ``path`` holds: ``path`` itself, or its ``adapter/`` (a LoRA run's
    ``policy/`` without the merged model); None when ``path`` is a model folder of its own."""
    folder = Path(path)
    if (folder / "config.json").is_file():
        return None
    for candidate in (folder, folder / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    return None


def adapter_base(path: str | Path) -> Path | None:
    """The base model folder a PEFT adapter folder names (a LoRA run's ``policy/`` or
    ``policy/adapter``), or None when ``path`` is a model folder of its own."""
    folder = adapter_folder(path)
    if folder is None:
        return None
    if not (folder / ADAPTER_WEIGHTS).is_file():  # PEFT would fall back to a pickled .bin
        raise ValueError(f"{folder} is a PEFT adapter folder without {ADAPTER_WEIGHTS}: only safetensors adapters load")
    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        raise ValueError(
            f"{folder} is a PEFT adapter folder whose base_model_name_or_path {base!r} is not a local "
            "model folder; export the merged policy (actor.lora.merged_export: true) and load that instead"
        )
    return Path(base)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, impl: str = "auto") -> Any:
    """The model of an HF-format folder; a PEFT adapter folder (or a folder holding one in
    ``adapter/``) gives its base with the adapter merged in (an adapter is then evaluated or
    served as the policy it trained)."""
    base, adapter = adapter_base(path), adapter_folder(path)
    if base is not None and adapter is not None:
        from rl_train.engines.training.lora import require_peft

        adapted = require_peft().PeftModel.from_pretrained(load_model(base, dtype, impl), str(adapter))
        return adapted.merge_and_unload()
    if resolve_impl(path, impl) == "native":
        from rl_train.engines.model.native import load_native

        return load_native(path, dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32, impl: str = "auto") -> tuple[Any, Any]:
    """The policy's model and tokenizer from a local HF directory, offline."""
    return load_model(path, dtype, impl), load_tokenizer(adapter_base(path) or path)


def is_native(model: Any) -> bool:
    from rl_train.engines.model.native import NativeCausalLM

    return isinstance(model, NativeCausalLM)


def new_kv_cache(model: Any, capacity: int = 0) -> Any:
    """An empty KV cache of the kind ``model``'s forward takes (``cache=``); ``capacity``: the
    positions it will need at most, where known (the native cache then never grows)."""
    if is_native(model):
        return model.new_cache(capacity)
    from transformers import DynamicCache

    return DynamicCache()


def save_policy(model: Any, tokenizer: Any, source: str | Path, out: str | Path, state: dict[str, Any] | None = None) -> None:
    """An HF model directory at ``out`` that transformers loads as it is: the weights (``state``,
    when the model's own are sharded) as safetensors, the config and the tokenizer."""
    if is_native(model):
        from rl_train.engines.model.native import save_native

        save_native(model, source, out, state)
    elif state is None:
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out)
