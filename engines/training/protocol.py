"""The training engine contract (R-4.1-4.3, R-4.6)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import torch

Batch = dict[str, torch.Tensor]
LossFn = Callable[[Batch, Batch], tuple[torch.Tensor, float, dict[str, float]]]
"""loss_fn(model_output, micro_batch) -> (loss numerator, denominator, metrics) (R-4.3)."""


@runtime_checkable
class TrainingEngine(Protocol):
    def forward_backward_batch(
        self, batch: Batch, loss_fn: LossFn | None, forward_only: bool
    ) -> dict[str, object]:
        """forward_only: per-token log-probs (and entropy) of the batch, no grad, eval mode.
        Otherwise: zero_grad, forward/backward over micro-batches with the global
        denominator, clip, optimizer step; returns the update's metrics."""
        ...

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named tensors for the rollout side (R-4.6)."""
        ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...
