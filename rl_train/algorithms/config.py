"""Config of the RL algorithm: which registered estimators and losses to use, and their knobs.

``AlgorithmConfig`` is the ``algorithm.*`` section. ``PolicyLossConfig`` holds the loss fields
that live flat under ``actor.*`` (the actor config inherits it), as users of other
frameworks expect (``actor.policy_loss``, ``actor.loss_agg_mode``...).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Base of every config section: unknown keys fail, every field carries a docstring."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class AlgorithmConfig(StrictModel):
    adv_estimator: str = "grpo"
    """Registered advantage estimator (rl_train.algorithms.advantage.ADV_ESTIMATORS)."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide the group-centred reward by the group's (unbiased) std."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount factor for token-level estimators (GAE, REINFORCE++)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE lambda."""


KlEstimator = Literal["k1", "k2", "k3", "low_var_kl", "abs", "mse"]


class PolicyLossConfig(StrictModel):
    policy_loss: str = "vanilla"
    """Registered policy loss (rl_train.algorithms.policy_loss.POLICY_LOSSES)."""
    clip_ratio_low: float = Field(0.2, ge=0.0)
    """PPO clip: lower bound of the ratio is 1 - clip_ratio_low."""
    clip_ratio_high: float = Field(0.2, ge=0.0)
    """PPO clip: upper bound of the ratio is 1 + clip_ratio_high (DAPO clip-higher when larger)."""
    clip_ratio_c: float = Field(3.0, gt=1.0)
    """Dual-clip constant c: negative-advantage losses are bounded by c * |A|."""
    loss_agg_mode: Literal[
        "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How per-token losses become one number; denominators are global over micro-batches and ranks."""
    entropy_coeff: float = Field(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    kl_loss: bool = False
    """Add a KL-to-reference penalty to the loss (needs the ref phase)."""
    kl_loss_coef: float = Field(0.0, ge=0.0)
    """Weight of the KL-to-reference loss."""
    kl_penalty: KlEstimator = "low_var_kl"
    """KL estimator used for the reference penalty."""
