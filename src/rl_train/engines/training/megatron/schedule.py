"""Micro-batches through megatron-core's own schedules (``get_forward_backward_func``).

- ``forward_log_probs``: the inference passes (old_log_prob, ref) with ``forward_only``; the
  per-token log-probs come back through the schedule's collected non-loss data.
- ``forward_backward``: the update's passes. The project's loss function (``LossFn``:
  ``(model_output, micro_batch) -> (numerator, denominator, metrics)``) goes into the
  schedule's loss-function slot. The schedule runs with ``calculate_per_token_loss``, so it
  backpropagates each micro-batch's loss *numerator* without dividing by the number of
  micro-batches; the caller divides the summed gradients once by the global denominator
  (summed over micro-batches and data-parallel ranks, R-4.3), so the update does not depend on
  how the batch is cut.

Batches are right-padded (each row's real tokens first): the causal mask alone then keeps
padding out of every real position, and positions are ``0..T-1``. A row with a gap is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from rl_train.algorithms.teacher_fields import STUDENT_TOPK_LOG_PROBS, TEACHER_TOPK_IDS
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.moe_bridge import (
    recorded_routes,
    set_replay,
    start_recording,
    stop_routing_control,
)
from rl_train.engines.training.protocol import Batch, LossFn
from rl_train.engines.training.token_outputs import token_entropy, token_log_probs, token_topk_log_probs


def check_right_padded(attention_mask: torch.Tensor) -> None:
    """``ValueError`` unless every row of the mask is ones, then zeros."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1, keepdim=True)
    expected = torch.arange(mask.shape[-1]).unsqueeze(0) < lengths
    if not torch.equal(mask, expected):
        rows = (mask != expected).any(-1).nonzero().flatten().tolist()
        raise ValueError(f"the megatron engine takes right-padded batches; rows {rows} have padding inside")


def split_batch(batch: Batch, micro_batch_size: int) -> list[Batch]:
    """Consecutive micro-batches of ``micro_batch_size`` rows (the last may be shorter)."""
    size = batch["input_ids"].shape[0]
    return [{k: v[i : i + micro_batch_size] for k, v in batch.items()} for i in range(0, size, micro_batch_size)]


def token_outputs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float,
    vocab_size: int | None,
    with_entropy: bool,
    topk_ids: torch.Tensor | None = None,
) -> Batch:
    """``log_probs`` (and ``entropy``) from the model's logits; columns past ``vocab_size`` (the
    padding of a vocabulary split over tensor-parallel ranks) are dropped first. With ``topk_ids``
    (a teacher's top-k, ``[B, T, k]``) also ``student_topk_log_probs`` at those ids (R-4.10)."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    out = {"log_probs": token_log_probs(logits, input_ids, temperature)}
    if with_entropy:
        out["entropy"] = token_entropy(logits, temperature)
    if topk_ids is not None:
        out[STUDENT_TOPK_LOG_PROBS] = token_topk_log_probs(logits, topk_ids, temperature)
    return out


def _logits(model: Any, micro_batch: Batch) -> torch.Tensor:
    """The model's logits; an MoE model sends each token to the experts ``routes`` gives
    when the micro-batch carries them (router replay, R-4.8)."""
    input_ids = micro_batch["input_ids"]
    if "routes" in micro_batch:
        set_replay(model, micro_batch["routes"])
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    return model(input_ids, positions, attention_mask=None)


def _run(model: Any, micro_batches: list[Batch], forward_step: Any, forward_only: bool, **kwargs: Any) -> list[Any]:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for micro_batch in micro_batches:
        check_right_padded(micro_batch["attention_mask"])
    width = max(int(mb["input_ids"].shape[1]) for mb in micro_batches)
    iterator: Iterator[Batch] = iter(micro_batches)
    with megatron_on_this_device(), _routing_released(model):
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterator,
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=width,
            micro_batch_size=int(micro_batches[0]["input_ids"].shape[0]),
            forward_only=forward_only,
            **kwargs,
        )


@contextlib.contextmanager
def _routing_released(model: Any) -> Iterator[None]:
    """Whatever routing a pass recorded or replayed ends with it."""
    try:
        yield
    finally:
        stop_routing_control(model)


def pad_positions(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` [B, T, ...] padded with zeros along its positions to ``width``."""
    if tensor.shape[1] == width:
        return tensor
    pad = torch.zeros((tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]), dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, pad], dim=1)


@torch.no_grad()
def forward_log_probs(
    model: Any,
    micro_batches: list[Batch],
    temperature: float,
    vocab_size: int | None = None,
    with_entropy: bool = False,
    record_routes: bool = False,
) -> Batch | None:
    """Per-token ``log_probs`` [B, T] (and ``entropy``) of right-padded micro-batches, forward
    only, in eval mode, put back together at the widest one's width; None on a pipeline stage
    other than the last (only the last sees the logits). With pipeline stages every
    micro-batch must have the same shape. ``record_routes``: an MoE model also gives the
    experts each token went to, ``routes`` [B, T, L, k] (R2 records them here)."""

    def forward_step(data_iterator: Iterator[Batch], model: Any) -> tuple[torch.Tensor, Any]:
        micro_batch = next(data_iterator)
        if record_routes:
            start_recording(model)
        logits = _logits(model, micro_batch)
        rows, width = micro_batch["input_ids"].shape
        routes = recorded_routes(model, rows, width) if record_routes else None

        def collect(output: torch.Tensor, non_loss_data: bool = True) -> Batch:
            out = token_outputs(output, micro_batch["input_ids"], temperature, vocab_size, with_entropy)
            return out if routes is None else {**out, "routes": routes}

        return logits, collect

    model.eval()
    parts = _run(model, micro_batches, forward_step, True, collect_non_loss_data=True)
    if not parts:
        return None
    width = max(int(mb["input_ids"].shape[1]) for mb in micro_batches)
    return {key: torch.cat([pad_positions(part[key], width) for part in parts]) for key in parts[0]}


def forward_backward(
    model: Any,
    micro_batches: list[Batch],
    loss_fn: LossFn,
    temperature: float,
    vocab_size: int | None = None,
    with_entropy: bool = False,
) -> tuple[float, float, dict[str, float]]:
    """Backpropagate every micro-batch's loss numerator through megatron's schedule; returns
    (sum of numerators, sum of denominators, token-weighted metrics), all zero on a pipeline
    stage other than the last. Gradients are sums: the caller divides them by the global
    denominator."""
    model.config.calculate_per_token_loss = True
    totals = {"numerator": 0.0, "denominator": 0.0}
    weighted: dict[str, float] = {}

    def forward_step(data_iterator: Iterator[Batch], model: Any) -> tuple[torch.Tensor, Any]:
        micro_batch = next(data_iterator)
        logits = _logits(model, micro_batch)

        def loss(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            topk_ids = micro_batch.get(TEACHER_TOPK_IDS)
            outputs = token_outputs(output, micro_batch["input_ids"], temperature, vocab_size, with_entropy, topk_ids)
            numerator, denominator, metrics = loss_fn(outputs, micro_batch)
            totals["numerator"] += float(numerator.detach())
            totals["denominator"] += float(denominator)
            tokens = float(micro_batch["response_mask"].sum())
            for key, value in metrics.items():
                weighted[key] = weighted.get(key, 0.0) + float(value) * tokens
            return numerator, torch.tensor(int(round(float(denominator)))), {}  # megatron counts in int

        return logits, loss

    model.train()
    _run(model, micro_batches, forward_step, False)
    tokens = max(sum(float(mb["response_mask"].sum()) for mb in micro_batches), 1.0)
    return totals["numerator"], totals["denominator"], {k: v / tokens for k, v in weighted.items()}
