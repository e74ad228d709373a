"""The value engine contract: what a critic worker calls on its value model (R-3.1 steps 6 and 8).

A value engine is a training engine whose forward pass gives values instead of log-probs:
the same micro-batching and the same exact data-parallel update (loss numerators summed over
the ranks, divided once by the global denominator, R-4.2, R-4.3), so ``train_batch`` does not
depend on how the batch is cut. ``ValueEngine`` lists everything the critic worker uses;
tests/unit/test_engine_contracts.py holds the worker to it and
tests/unit/test_engine_conformance.py checks every value engine's behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from rl_train.engines.training.protocol import Batch, LossFn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@runtime_checkable
class ValueEngine(Protocol):
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (the worker pads batches with its pad id)."""
        ...

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Forward only, no grad: V(s_t) per position of a right-padded batch, [B, T] like
        ``batch["input_ids"]``; position t holds the value of the state token t is generated
        in, aligned with the log-probs (position 0 gets 0)."""
        ...

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One critic optimizer step over the batch (``values``, ``returns``, ``response_mask``
        among its fields), independent of the micro-batch cut; returns the step's metrics."""
        ...

    def state_dict(self) -> dict[str, object]:
        """Model, optimizer and scheduler state (a checkpoint, R-9.2)."""
        ...

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what ``state_dict`` returned: the next update is the one the saved engine made."""
        ...
