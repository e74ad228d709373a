"""The training engine contract (R-4.1-4.3, R-4.6, R-4.8, R-2.8).

``TrainingEngine`` lists everything a trainer worker (and the router-replay strategy it
builds) calls on its policy and reference engines: tests/unit/test_engine_contracts.py
fails when a worker reaches for a member or keyword argument that is not declared here. What
an engine may lack is declared too, as a member that says so (``replays_routes``), never
found out by probing. An engine joins by being registered in
``rl_train.engines.training.registry``; the conformance suite
(tests/unit/test_engine_conformance.py) then checks its behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from rl_train.engines.weight_sync.base import NamedTensors

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Batch = dict[str, torch.Tensor]
LossFn = Callable[[Batch, Batch], tuple[torch.Tensor, float, dict[str, float]]]
"""loss_fn(model_output, micro_batch) -> (loss numerator, denominator, metrics) (R-4.3)."""
ROUTES = "routes"
"""The batch field of per-token MoE routes, [B, T, L, k]: per token, per MoE layer, its experts."""


class RoutesNotSupportedError(ValueError):
    """Routes were asked of, or handed to, an engine whose ``replays_routes`` is False."""


@runtime_checkable
class TrainingEngine(Protocol):
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (the worker pads batches with its pad id)."""
        ...

    @property
    def data_parallel_rank(self) -> int:
        """This rank's data-parallel index: the ranks that split one model (tensor or pipeline
        parallel) share it, and with it the batch shard they read."""
        ...

    @property
    def replays_routes(self) -> bool:
        """Whether the engine can route an MoE model's tokens by recorded experts (R-4.8):
        ``compute_log_probs(record_routes=True)`` returns ``routes``, and a batch carrying
        ``routes`` sends each token to those experts, in both passes. An engine that cannot
        says False here and refuses both (``RoutesNotSupportedError``)."""
        ...

    @property
    def reference_is_base(self) -> bool:
        """Whether the reference model is this engine's own base (LoRA: the adapters off): the
        worker then builds no reference engine and asks ``compute_log_probs(base=True)``."""
        ...

    def compute_log_probs(
        self,
        batch: Batch,
        *,
        with_entropy: bool = False,
        pi_old: bool = False,
        record_routes: bool = False,
        base: bool = False,
    ) -> Batch:
        """Forward only, no grad: per-token ``log_probs`` [B, T] of a right-padded batch
        (and ``entropy`` if asked). ``pi_old``: under the weights pinned by
        ``snapshot_pi_old``, or the current ones when none are pinned. ``record_routes``
        (only where ``replays_routes``): also ``routes`` [B, T, L, k], the experts each token
        went to ([B, T, 0, 0] for a dense model). ``base`` (only where ``reference_is_base``):
        the base model's log-probs, bit for bit."""
        ...

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over the batch, cut into micro-batches: the update does not
        depend on the cut (R-4.2). Returns the step's metrics, among them
        ``actor/nonfinite_steps``: 1.0 when a NaN/inf grad norm skipped the step, else 0.0
        (the worker stops a run after ``actor.max_nonfinite_steps_in_row`` skips)."""
        ...

    def snapshot_pi_old(self) -> None:
        """Pin the current weights as pi_old (R-2.8), kept off the device, until ``clear_pi_old``."""
        ...

    def clear_pi_old(self) -> None: ...

    def export_weights(self) -> NamedTensors:
        """HF-named tensors for the rollout side (R-4.6). With a model split over ranks (TP/PP,
        FSDP) a collective: every rank of the split calls it together."""
        ...

    def export_adapters(self) -> NamedTensors:
        """Only where ``reference_is_base`` (LoRA): the adapters alone, as an adapter-only weight
        sync sends them (names and scale as ``weight_sync.adapters`` says)."""
        ...

    def state_dict(self) -> dict[str, object]:
        """Model, optimizer and scheduler state (a checkpoint, R-9.2): nested dicts and lists of
        tensors and plain values, which the checkpoint store writes as safetensors + JSON."""
        ...

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what ``state_dict`` returned: the next update is the one the saved engine made."""
        ...

    def save_pretrained(self, path: Path) -> None:
        """Write the policy as an HF model directory (safetensors, config, tokenizer) that
        ``transformers`` loads as it is (R-9.5)."""
        ...
