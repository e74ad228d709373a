"""Off-policy metrics under ``rollout_corr/`` (R-7.6) and the runbook warnings of R-10.3.

With lr = old_log_prob - rollout_log_prob over the response mask (raw; bounded to +-20 only
right before exp), and per sequence i the token-mean log-probs m_i(old), m_i(rollout):
- kl = mean_t(-lr) (k1 estimate of KL(rollout || old)); k3_kl = mean_t(exp(lr) - 1 - lr)
- training_ppl = mean_i exp(-m_i(old)); rollout_ppl = mean_i exp(-m_i(rollout))
- log_ppl_diff = mean_i (m_i(rollout) - m_i(old)); ppl_ratio = mean_i exp(m_i(rollout) - m_i(old))
- chi2_token = mean_t exp(2 lr) - 1; chi2_seq = mean_i exp(2 sum_t lr) - 1
- rollout_is_{mean,std,min,max}, rollout_is_eff_sample_size = (sum w)^2 / (n sum w^2) in (0, 1]
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping

import torch

from rl_train.algorithms.log_ratio import bounded_exp
from rl_train.algorithms.masked import masked_mean, masked_sum

logger = logging.getLogger(__name__)

KL_COLLAPSE = 0.5
"""rollout_corr/kl above this: training and rollout disagree enough to collapse training."""
CHI2_SEQ_PREFER_RS = 10.0
"""chi2_seq above this: sequence IS weights are too heavy-tailed, rejection sampling is safer."""
ESS_TIGHTEN = 0.2
"""IS effective sample size below this: a few samples dominate, tighten the IS thresholds."""
RISING_STEPS = 3
"""k3_kl / ppl_ratio rising this many steps in a row: off-policyness is accumulating."""


def off_policy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Divergence metrics between the training and the rollout engine; see the module docstring."""
    log_ratio = old_log_prob - rollout_log_prob
    has_tokens = mask.any(dim=-1)
    seq_old = masked_mean(old_log_prob, mask, dim=-1)[has_tokens]
    seq_rollout = masked_mean(rollout_log_prob, mask, dim=-1)[has_tokens]
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1)[has_tokens]
    diff = seq_rollout - seq_old

    def mean(x: torch.Tensor) -> float:
        return float(x.mean()) if x.numel() else 0.0

    chi2_seq = mean(bounded_exp(seq_log_ratio).square()) - 1.0 if seq_log_ratio.numel() else 0.0
    return {
        "rollout_corr/kl": float(masked_mean(-log_ratio, mask)),
        "rollout_corr/k3_kl": float(masked_mean(bounded_exp(log_ratio) - 1 - log_ratio, mask)),
        "rollout_corr/training_ppl": mean(torch.exp(-seq_old)),
        "rollout_corr/rollout_ppl": mean(torch.exp(-seq_rollout)),
        "rollout_corr/log_ppl_diff": mean(diff),
        "rollout_corr/ppl_ratio": mean(bounded_exp(diff)),
        "rollout_corr/chi2_token": float(masked_mean(bounded_exp(log_ratio).square(), mask)) - 1.0,
        "rollout_corr/chi2_seq": chi2_seq,
    }


def weight_statistics(weights: torch.Tensor) -> dict[str, float]:
    """Mean / std / min / max and normalised effective sample size of a 1-D weight vector."""
    if weights.numel() == 0:
        return {}
    w = weights.double()
    ess = float(w.sum().square() / (w.numel() * w.square().sum()).clamp(min=1e-30))
    return {
        "rollout_corr/rollout_is_mean": float(w.mean()),
        "rollout_corr/rollout_is_std": float(w.std(unbiased=False)),
        "rollout_corr/rollout_is_min": float(w.min()),
        "rollout_corr/rollout_is_max": float(w.max()),
        "rollout_corr/rollout_is_eff_sample_size": ess,
    }


class RunbookMonitor:
    """Checks each step's ``rollout_corr/*`` metrics against the runbook (R-10.3) and logs warnings."""

    def __init__(self) -> None:
        self._history: dict[str, deque[float]] = {
            key: deque(maxlen=RISING_STEPS + 1) for key in ("rollout_corr/k3_kl", "rollout_corr/ppl_ratio")
        }

    def state_dict(self) -> dict[str, list[float]]:
        return {key: list(history) for key, history in self._history.items()}

    def load_state_dict(self, state: Mapping[str, list[float]]) -> None:
        for key, values in state.items():
            if key in self._history:
                self._history[key].clear()
                self._history[key].extend(float(v) for v in values)

    def check(self, metrics: Mapping[str, float]) -> list[str]:
        """Return (and log at WARNING) the runbook messages triggered by this step's metrics."""
        warnings = []
        if metrics.get("rollout_corr/kl", 0.0) > KL_COLLAPSE:
            warnings.append(
                f"rollout_corr/kl={metrics['rollout_corr/kl']:.3g} > {KL_COLLAPSE}: risk of collapse"
            )
        if metrics.get("rollout_corr/chi2_seq", 0.0) > CHI2_SEQ_PREFER_RS:
            warnings.append(
                f"rollout_corr/chi2_seq={metrics['rollout_corr/chi2_seq']:.3g} > {CHI2_SEQ_PREFER_RS}: "
                "prefer rejection sampling (rollout_rs) over IS"
            )
        ess = metrics.get("rollout_corr/rollout_is_eff_sample_size")
        if ess is not None and ess < ESS_TIGHTEN:
            warnings.append(
                f"rollout_corr/rollout_is_eff_sample_size={ess:.3g} < {ESS_TIGHTEN}: tighten thresholds"
            )
        for key, history in self._history.items():
            if key in metrics:
                history.append(float(metrics[key]))
            values = list(history)
            if len(values) == RISING_STEPS + 1 and all(
                a < b for a, b in zip(values, values[1:], strict=False)
            ):
                warnings.append(f"{key} rose {RISING_STEPS} steps in a row: off-policy drift is accumulating")
        for message in warnings:
            logger.warning("runbook: %s", message)
        return warnings
