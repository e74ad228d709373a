"""A small real rollout engine for the weight-sync tests: a torch module that loads weights.

It keeps the lifecycle the boundaries drive (abort, release/resume KV, reset prefix cache)
as observable state, refuses to serve a prefix cache across versions, and copies every
received tensor into its own parameters and buffers, as a real engine does.
"""

from __future__ import annotations

import torch
from torch import nn

from rl_train.engines.weight_sync.base import NamedTensors
from rl_train.engines.weight_sync.boundaries import SparseUpdates, write_entries


class TinyModule(nn.Module):
    """Holds arbitrary named tensors: floats as parameters, everything else as buffers."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, tensor in weights.items():
            key = name.replace(".", "__")
            if tensor.is_floating_point():
                self.register_parameter(key, nn.Parameter(torch.zeros_like(tensor), requires_grad=False))
            else:
                self.register_buffer(key, torch.zeros_like(tensor))


class TinyRolloutEngine:
    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.module = TinyModule(weights)
        self.version = -1
        self.kv_cache_released = False
        self.prefix_cache: dict[str, int] = {"warm-prefix": self.version}
        self.events: list[str] = []
        self.fail_after_tensors: int | None = None
        """Fault injection: the next update raises after loading this many tensors (out of memory)."""

    def abort(self) -> int:
        self.events.append("abort")
        return 0

    def release_kv_cache(self) -> None:
        self.kv_cache_released = True
        self.events.append("release_kv_cache")

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        state = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        fail_after, self.fail_after_tensors = self.fail_after_tensors, None
        with torch.no_grad():
            for number, (name, tensor) in enumerate(named_tensors):
                if number == fail_after:
                    raise RuntimeError(f"out of memory while loading {name}")
                target = state[name.replace(".", "__")]
                if target.shape != tensor.shape or target.dtype != tensor.dtype:
                    raise ValueError(f"{name}: got {tensor.dtype}{tuple(tensor.shape)}")
                target.copy_(tensor)
        self.version = version
        self.events.append(f"update_weights:{version}")

    def reset_prefix_cache(self) -> None:
        self.prefix_cache = {}
        self.events.append("reset_prefix_cache")

    def resume_kv_cache(self) -> None:
        if any(cached != self.version for cached in self.prefix_cache.values()):
            raise RuntimeError("prefix cache holds entries of another weight version")
        self.kv_cache_released = False
        self.events.append("resume_kv_cache")

    def weights(self) -> dict[str, torch.Tensor]:
        state = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        return {name.replace("__", "."): tensor.detach().clone() for name, tensor in state.items()}


class SparseTinyRolloutEngine(TinyRolloutEngine):
    """Also takes sparse updates, written in place, as the built-in torch engine does."""

    def update_weights_sparse(self, updates: SparseUpdates, version: int) -> None:
        state = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        with torch.no_grad():
            for name, index, values in updates:
                write_entries(state[name.replace(".", "__")], index, values)
        self.version = version
        self.events.append(f"update_weights_sparse:{version}")
