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
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_train.registry import Registry

Aggregator = Callable[[torch.Tensor, torch.Tensor, float | None], tuple[torch.Tensor, float]]


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


def needs_norm_length(aggregator: Aggregator) -> bool:
    """Whether the mode divides by a constant length that the config must give (R-4.3)."""
    return bool(getattr(aggregator, "needs_norm_length", False))


def _seq_mean_token_sum_norm(
    loss: torch.Tensor, mask: torch.Tensor, norm_length: float | None
) -> tuple[torch.Tensor, float]:
    # Without a constant L the padded width is used, which depends on the micro-batch:
    # the config requires loss_agg_norm_length for this mode.
    length = norm_length if norm_length is not None else loss.shape[-1]
    return (loss * mask).sum() / length, _num_seqs(mask)


_seq_mean_token_sum_norm.needs_norm_length = True  # type: ignore[attr-defined]


AGGREGATORS: Registry[Aggregator] = Registry.from_table(
    "loss_agg_mode",
    {
        "token-mean": _token_mean,
        "token-sum": _token_sum,
        "seq-mean-token-sum": _seq_mean_token_sum,
        "seq-mean-token-mean": _seq_mean_token_mean,
        "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    },
)
LOSS_AGG_MODES = tuple(AGGREGATORS.names())


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: float | None = None
) -> tuple[torch.Tensor, float]:
    """Return (numerator, denominator) of the mode's mean; see the module docstring."""
    try:
        aggregator = AGGREGATORS.get(mode)
    except KeyError as err:
        raise ValueError(str(err)) from None
    return aggregator(per_token_loss, mask.to(per_token_loss.dtype), norm_length)


def norm_length_error(mode: str, norm_length: float | None) -> str | None:
    """Why ``mode`` cannot run without a constant length (None when it can), for config checks."""
    if mode in AGGREGATORS and needs_norm_length(AGGREGATORS.get(mode)) and norm_length is None:
        return (
            f"loss_agg_mode {mode} needs loss_agg_norm_length (a constant, e.g. the max "
            "response length); the padded length would make the loss depend on the micro-batch split"
        )
    return None
