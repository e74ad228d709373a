"""Stop a run that keeps skipping optimizer steps for non-finite gradients.

A training engine skips the optimizer step when the grad norm is NaN or inf, so one bad
batch (a NaN reward, an overflow) costs one step and not the weights. A run that skips
every step, though, trains nothing while its metrics still look alive. The trainer worker
feeds every step to ``NonFiniteStepGuard``, which counts the skips in a row and ends the run
after ``actor.max_nonfinite_steps_in_row`` of them, with the likely causes in the message.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

LIKELY_CAUSES = (
    "NaN/inf advantages or rewards (a reward function that returns NaN or inf), a learning rate "
    "high enough to overflow the loss (actor.lr), bfloat16 overflow (actor.dtype), or extreme "
    "log-ratios between the policy and the rollout log-probs"
)


class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite grad norm: the run no longer trains."""


class NonFiniteStepGuard:
    def __init__(self, max_in_row: int) -> None:
        """``max_in_row``: ``actor.max_nonfinite_steps_in_row``."""
        if max_in_row < 1:
            raise ValueError(f"actor.max_nonfinite_steps_in_row must be >= 1, got {max_in_row}")
        self.max_in_row = max_in_row
        self.in_row = 0
        """Optimizer steps skipped since the last finite one."""

    def record(self, skipped: bool) -> None:
        """Count one optimizer step; raise ``NonFiniteStepsError`` at ``max_in_row`` skips in a row."""
        if not skipped:
            self.in_row = 0
            return
        self.in_row += 1
        logger.warning(
            "optimizer step skipped: non-finite grad norm (%d in a row; the run stops at %d)",
            self.in_row,
            self.max_in_row,
        )
        if self.in_row >= self.max_in_row:
            raise NonFiniteStepsError(
                f"{self.in_row} optimizer steps in a row had a non-finite (NaN/inf) gradient norm and "
                f"were skipped (actor.max_nonfinite_steps_in_row = {self.max_in_row}), so the run is "
                f"stopped: it no longer trains. Likely causes: {LIKELY_CAUSES}."
            )
