"""The critic's loss function (R-4.3 contract) and its diagnostics.

Like the actor's, the value engine does not know the loss: it calls
``loss_fn(model_output, micro_batch) -> (loss_sum, denominator, metrics)`` and divides the
summed numerators by the global denominator once. ``model_output["values"]`` are the new
values; the micro-batch carries the values of the values phase (``values``, V_old) and the
advantage phase's ``returns``, all ``[B, T]`` and zero outside ``response_mask``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_train.algorithms.config import ValueLossConfig
from rl_train.algorithms.masked import masked_mean, masked_var
from rl_train.algorithms.value_loss import value_loss_terms

Batch = dict[str, torch.Tensor]
LossFn = Callable[[Batch, Batch], tuple[torch.Tensor, float, dict[str, float]]]
CONSTANT_VARIANCE = 1e-8
"""Returns whose variance is below this count as constant for ``explained_variance``."""


def build_critic_loss_fn(cfg: ValueLossConfig) -> LossFn:
    """The clipped value loss of ``cfg``, aggregated by ``cfg.loss_agg_mode``."""

    def critic_loss(model_output: Batch, micro_batch: Batch) -> tuple[torch.Tensor, float, dict[str, float]]:
        mask = micro_batch["response_mask"]
        values = model_output["values"]
        numerator, denominator, metrics = value_loss_terms(
            values, micro_batch["values"], micro_batch["returns"], mask, cfg
        )
        out = {key: float(value) for key, value in metrics.items()}
        out["critic/values_mean"] = float(masked_mean(values.detach(), mask))
        return numerator, denominator, out

    return critic_loss


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens, all ``[B, T]``.

    1: the values predict the returns exactly; 0: no better than the returns' mean; negative:
    worse. A batch of (nearly) constant returns gives 0: dividing by a Var(R) made of rounding
    noise (GAE returns of an all-zero-reward batch are ~1e-10, not 0) would report -1e15.
    """
    var_returns = masked_var(returns, mask)
    if not var_returns > CONSTANT_VARIANCE:
        return 0.0
    return float(1.0 - masked_var(returns - values, mask) / var_returns)
