"""LoRA adapters synced alone, merged into the built-in rollout engine's weights.

An adapter-only sync (``weight_sync.adapters``) carries each adapted layer's A and scaled B.
The engine serves W = W0 + B A, merged in place into the weight the model already uses, so
generation runs exactly as without LoRA (the fused q/k/v and gate/up stacks included: they
are views of the weights). Each adapted layer keeps, as non-persistent buffers of its own
module (they move with the weights when the engine sleeps, and stay out of the state dict):

- ``lora_base``: W0, the weight as it was when the layer's first adapter arrived;
- ``lora_A``, ``lora_B``: the adapter last received (B scaled), which a ``delta`` sync
  updates entry by entry before the layer is merged again.

Merged rather than applied beside the weights on every token: decoding then costs what it
costs without LoRA, and a sync re-merges each layer once (``bench/lora.py`` measures both).

A full weight sent for an adapted layer replaces it: the layer forgets its adapter and serves
what was sent, and its next adapter is merged onto that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rl_train.engines.weight_sync.adapters import PARTS, WEIGHT, merged, split_adapter_name

BASE = "lora_base"


class AdapterMerger:
    """Routes a sync's tensors: adapter parts into their layers' buffers, the rest through."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._touched: dict[str, None] = {}
        self._adapted: set[str] = set()
        """Weight names whose layer keeps W0: a full sync's other tensors pass through untouched."""

    def _layer(self, weight_name: str) -> tuple[torch.nn.Module, torch.Tensor]:
        """The module that holds ``weight_name``, and that weight."""
        try:
            module = self.model.get_submodule(weight_name[: -len(WEIGHT)])
        except AttributeError:
            module = None
        weight = getattr(module, "weight", None)
        if module is None or not isinstance(weight, torch.Tensor):
            raise KeyError(f"an adapter arrived for {weight_name!r}, which the rollout model does not have")
        return module, weight

    def route(
        self, items: Iterable[tuple[Any, ...]], write: Callable[[torch.Tensor, tuple[Any, ...]], object]
    ) -> Iterator[tuple[Any, ...]]:
        """Every (name, *rest) item that is not an adapter part, unchanged; an adapter part is
        written into its layer's buffer by ``write(buffer, rest)`` (a whole tensor: made when
        missing or of another shape). A full weight of an adapted layer drops its adapter."""
        for name, *rest in items:
            split = split_adapter_name(name)
            if split is None:
                if name in self._adapted:
                    self.forget(name)
                yield (name, *rest)
                continue
            weight_name, part = split
            layer, weight = self._layer(weight_name)
            if BASE not in layer._buffers:
                layer.register_buffer(BASE, weight.detach().clone(), persistent=False)
                self._adapted.add(weight_name)
            write(self._part(layer, weight.device, part, rest), tuple(rest))
            self._touched[weight_name] = None

    def _part(self, layer: torch.nn.Module, device: torch.device, part: str, rest: list[Any]) -> torch.Tensor:
        held = layer._buffers.get(part)
        if held is None:
            if len(rest) != 1:  # a sparse update names entries of a tensor that must exist already
                raise KeyError(f"a sparse update of {part} reached a layer that has no adapter yet")
            held = torch.empty_like(rest[0], device=device)
            layer.register_buffer(part, held, persistent=False)
        elif len(rest) == 1 and held.shape != rest[0].shape:
            held = torch.empty_like(rest[0], device=device)
            layer.register_buffer(part, held, persistent=False)
        return held

    def forget(self, weight_name: str) -> None:
        """The adapted layer of ``weight_name`` serves what it is sent from now on."""
        self._adapted.discard(weight_name)
        layer, _ = self._layer(weight_name)
        for key in (BASE, *PARTS):
            layer._buffers.pop(key, None)

    @torch.no_grad()
    def merge(self) -> int:
        """Merge every layer an adapter reached since the last call; how many."""
        touched, self._touched = list(self._touched), {}
        for weight_name in touched:
            layer, weight = self._layer(weight_name)
            missing = [part for part in PARTS if part not in layer._buffers]
            if missing:
                raise KeyError(
                    f"the adapter of {weight_name!r} arrived without {missing}: a sync sends both parts"
                )
            base, a, b = (layer._buffers[key] for key in (BASE, *PARTS))
            assert base is not None and a is not None and b is not None
            weight.copy_(merged(base, a, b))
        return len(touched)

    def adapted(self) -> list[str]:
        """The weight names that serve a merged adapter now."""
        return [f"{name}{WEIGHT}" for name, module in self.model.named_modules() if BASE in module._buffers]
