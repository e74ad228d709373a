"""Loss aggregation: per-token losses -> (numerator, denominator) with a global denominator.

The training engine sums numerators and denominators over every micro-batch and every DP rank
and divides once (R-4.3), so the result does not depend on how a batch is split: every mode
below is a ratio of two *sums over sequences*, never a mean of per-micro-batch means.
``token-sum`` returns a zero denominator; the engine clamps the global one to >= 1.

Modes (N = sequences with at least one response token, L_i = response tokens of sequence i):
- token-mean: sum_it l_it / sum_i L_i
- token-sum: sum_it l_it
- seq-mean-token-sum: sum_i (sum_t l_it) / N
- seq-mean-token-mean: sum_i (sum_t l_it / L_i) / N
- seq-mean-token-sum-norm (Dr. GRPO): sum_i (sum_t l_it / L) / N with a constant L

The aggregators use tensor methods only, so this module imports no torch: the config checks
``loss_agg_mode`` against ``AGGREGATORS`` at load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    import torch

Aggregator = Callable[["torch.Tensor", "torch.Tensor", "float | None"], "tuple[torch.Tensor, float]"]


def _num_seqs(mask: torch.Tensor) -> float:
    return float((mask.sum(dim=-1) > 0).sum())


def _token_mean(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    return (loss * mask).sum(), float(mask.sum())


def _token_sum(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    return (loss * mask).sum(), 0.0


def _seq_mean_token_sum(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    return (loss * mask).sum(), _num_seqs(mask)


def _seq_mean_token_mean(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    per_seq = (loss * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_seq.sum(), _num_seqs(mask)


def _seq_mean_token_sum_norm(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    # Without a constant L the padded width is used, which depends on the micro-batch:
    # the config requires loss_agg_norm_length for this mode.
    length = norm_length if norm_length is not None else loss.shape[-1]
    return (loss * mask).sum() / length, _num_seqs(mask)


@dataclass(frozen=True)
class Aggregation(Entry[Aggregator]):
    """A loss aggregation mode, with its formula as its description."""

    needs_norm_length: bool = False
    """It divides by a constant length that the config must give (R-4.3)."""


AGGREGATORS: Registry[Aggregation] = Registry(
    "loss aggregation mode",
    "actor.loss_agg_mode, critic.loss_agg_mode",
    {
        "token-mean": Aggregation(_token_mean, "sum_it l_it / sum_i L_i"),
        "token-sum": Aggregation(_token_sum, "sum_it l_it"),
        "seq-mean-token-sum": Aggregation(_seq_mean_token_sum, "sum_i (sum_t l_it) / N"),
        "seq-mean-token-mean": Aggregation(_seq_mean_token_mean, "sum_i (sum_t l_it / L_i) / N"),
        "seq-mean-token-sum-norm": Aggregation(
            _seq_mean_token_sum_norm, "sum_i (sum_t l_it / L) / N with a constant L (Dr. GRPO)", needs_norm_length=True
        ),
    },
)


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: float | None = None
) -> tuple[torch.Tensor, float]:
    """Return (numerator, denominator) of the mode's mean; see the module docstring."""
    return AGGREGATORS.get(mode)(per_token_loss, mask.to(per_token_loss.dtype), norm_length)

