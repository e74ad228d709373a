"""KL coefficient controllers and the in-reward KL penalty (``algorithm.kl_in_reward``).

Fixed: beta never changes. Adaptive (Ziegler et al. 2019): after each step,
err = clip(kl / target_kl - 1, -0.2, 0.2); beta *= 1 + err * n_steps / horizon,
so beta grows while the policy drifts beyond the target and shrinks below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_train.algorithms.config import KLControlConfig
from rl_train.algorithms.kl import kl_penalty
from rl_train.algorithms.masked import masked_mean

PROPORTIONAL_ERROR_CLIP = 0.2
"""Caps the relative change of beta per horizon so a noisy KL spike cannot swing it."""


@dataclass
class FixedKLController:
    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is constant."""


@dataclass
class AdaptiveKLController:
    value: float
    target_kl: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        error = max(-PROPORTIONAL_ERROR_CLIP, min(PROPORTIONAL_ERROR_CLIP, current_kl / self.target_kl - 1))
        self.value *= 1 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController
_CONTROLLERS: dict[str, Callable[[KLControlConfig], KLController]] = {
    "fixed": lambda cfg: FixedKLController(cfg.kl_coef),
    "adaptive": lambda cfg: AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon),
}


def build_kl_controller(cfg: KLControlConfig) -> KLController:
    """The controller named by ``cfg.type`` (validated by the config's Literal)."""
    return _CONTROLLERS[cfg.type](cfg)


def apply_kl_penalty_to_rewards(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    controller: KLController,
    kind: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """rewards = scores - beta * KL_t on response tokens, then update beta with this batch's KL.

    The KL fed to the controller is the mean over sequences of each sequence's token-mean KL.
    Returns ([B, T] rewards, metrics) with beta as it was when applied.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kl = kl_penalty(log_prob, ref_log_prob, kind) * mask
    beta = controller.value
    rewards = token_level_scores - beta * kl
    current_kl = float(masked_mean(kl, mask, dim=-1).mean())
    controller.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
