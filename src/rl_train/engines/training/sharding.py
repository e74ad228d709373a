"""FSDP2 on the torch engine (``actor.fsdp``): how the policy is sharded, and how its tensors
and Adam's moments are read whole (a collective) or as this rank's own shards.

``fully_shard`` replaces each parameter by a DTensor holding this rank's rows. It takes a
module tree whose parameters do not all train: under LoRA the frozen base weights are sharded
and all-gathered for each forward like the adapters, but only parameters with a gradient are
reduce-scattered in backward (torch 2.13's ``FSDPParamGroup``: the dtype checks and the
gradient reduction look at ``requires_grad`` parameters only), so the adapters alone carry
sharded gradients and optimizer state.
"""

from __future__ import annotations

from typing import Any

import torch


def decoder_layers(model: torch.nn.Module) -> Any:
    """The policy's decoder layers: ``model.model.layers`` of an HF causal LM, the same under
    the PEFT wrapper's base model."""
    getter = getattr(model, "get_base_model", None)
    base = getter() if callable(getter) else model
    return base.model.layers  # type: ignore[union-attr]


def shard_model(model: torch.nn.Module) -> None:
    """FSDP2 (``fully_shard``): each decoder layer a unit, then the rest (embeddings, norm, head)
    under ``model`` itself, the root every forward goes through (under LoRA, the PEFT wrapper)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded DTensor (a collective), a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, a plain tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def local_state(state: dict[str, object]) -> dict[str, object]:
    """An optimizer state dict with every DTensor replaced by this rank's shard."""
    return {
        "state": {
            index: {key: local(value) if torch.is_tensor(value) else value for key, value in entry.items()}
            for index, entry in state["state"].items()  # type: ignore[attr-defined]
        },
        "param_groups": state["param_groups"],
    }


def reshard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After loading local shards: each moment a DTensor laid out as its parameter again."""
    from torch.distributed.tensor import DTensor

    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            entry = optimizer.state.get(param, {})
            for key, value in entry.items():
                if torch.is_tensor(value) and not isinstance(value, DTensor) and value.dim() > 0:
                    entry[key] = DTensor.from_local(
                        value.to(param.device), param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                    )
