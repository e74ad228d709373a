"""CPU weight snapshots for pi_old across local updates (R-2.8).

separate_async runs several local updates per global step; their old_log_prob must all use
the weights of local update 0. Slot 0 is a host (CPU) copy taken at local update 0. For an
old_log_prob pass the current weights are parked on the host, slot 0 is copied in, and the
current weights come back after, so the device never holds two copies of the weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rl_train.engines.training.sharding import local


class WeightSnapshots:
    def __init__(self) -> None:
        self._slot0: dict[str, torch.Tensor] | None = None

    @property
    def active(self) -> bool:
        return self._slot0 is not None

    def save(self, model: torch.nn.Module) -> None:
        self._slot0 = _host_copy(model)

    def clear(self) -> None:
        self._slot0 = None

    @contextmanager
    def swapped_in(self, model: torch.nn.Module) -> Iterator[None]:
        """Run the body with slot 0 loaded; the current weights are restored after, bitwise."""
        assert self._slot0 is not None, "save() first"
        current = _host_copy(model)
        _load(model, self._slot0)
        try:
            yield
        finally:
            _load(model, current)
            del current  # the temporary slot


def _host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (a frozen one, such as a LoRA base weight, never changes); of a
    sharded (FSDP) parameter, this rank's own shard: the pass that uses the slot gathers it."""
    return {name: local(p.detach()).to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def _load(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    for name, param in model.named_parameters():
        if name in state:
            local(param).copy_(state[name])
