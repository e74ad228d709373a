"""Config of the RL algorithm: which registered estimators and losses to use, and their knobs.

``AlgorithmConfig`` is the ``algorithm.*`` section. ``PolicyLossConfig`` holds the loss fields
that live flat under ``actor.*`` (the actor config inherits it), as users of other
frameworks expect (``actor.policy_loss``, ``actor.loss_agg_mode``...). ``ValueLossConfig`` is the
same for ``critic.*``. Registered names are checked at load time against their registries, so a
typo fails with the list of available names instead of at the first training step.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_train.algorithms.thresholds import parse_is_threshold, parse_rs_rules

LossAggMode = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
KlEstimator = Literal["k1", "k2", "k3", "low_var_kl", "abs", "mse"]


class StrictModel(BaseModel):
    """Base of every config section: unknown keys fail, every field carries a docstring."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


BUILTIN_NAMES: dict[tuple[str, str], frozenset[str]] = {
    ("rl_train.algorithms.policy_loss", "POLICY_LOSSES"): frozenset(
        {"cispo", "clip_cov", "dppo_kl", "dppo_tv", "geo_mean", "gpg", "gspo", "kl_cov", "sapo", "vanilla"}
    ),
    ("rl_train.algorithms.advantage", "ADV_ESTIMATORS"): frozenset(
        {"gae", "gpg", "grpo", "grpo_passk", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"}
    ),
}
"""What the built-in registries hold, known without importing them (they import torch, about
1.2 s that config validation need not pay); a test holds each set to its registry. A name
outside them is looked up in the registry itself, so registered extensions still validate."""


BUILTIN_CRITIC_ESTIMATORS = frozenset({"gae"})
"""The built-in advantage estimators that read critic values (the others read none); a test
holds this to what each declares in its registry."""


BUILTIN_GREEDY_BASELINE_ESTIMATORS = frozenset({"remax"})
"""The built-in advantage estimators that read a greedy baseline reward per prompt."""


def estimator_reads_critic(name: str) -> bool:
    """Whether the estimator ``name`` reads critic values, without importing the built-ins."""
    if name in BUILTIN_NAMES[("rl_train.algorithms.advantage", "ADV_ESTIMATORS")]:
        return name in BUILTIN_CRITIC_ESTIMATORS
    from rl_train.algorithms.advantage import estimator_needs

    return estimator_needs(name).critic


def estimator_reads_greedy_baseline(name: str) -> bool:
    """Whether the estimator ``name`` reads a greedy baseline, without importing the built-ins
    (the driver's step plan asks; the estimators and torch load in the queue actor only)."""
    if name in BUILTIN_NAMES[("rl_train.algorithms.advantage", "ADV_ESTIMATORS")]:
        return name in BUILTIN_GREEDY_BASELINE_ESTIMATORS
    from rl_train.algorithms.advantage import estimator_needs

    return estimator_needs(name).greedy_baseline


NO_NORM_LENGTH_MODES = frozenset({"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"})
"""Aggregation modes that need no constant length, known without importing the aggregators."""


def norm_length_problem(mode: str, norm_length: float | None) -> str | None:
    """Why ``mode`` cannot run without ``loss_agg_norm_length`` (None when it can)."""
    if norm_length is not None or mode in NO_NORM_LENGTH_MODES:
        return None
    from rl_train.algorithms.aggregation import norm_length_error

    return norm_length_error(mode, norm_length)


def _check_registered(module: str, registry: str, name: str) -> str:
    """Fail with the registry's own message (it lists the names) when ``name`` is unknown."""
    import importlib

    if name in BUILTIN_NAMES.get((module, registry), ()):
        return name
    table = getattr(importlib.import_module(module), registry)
    if name not in table:
        try:
            table.get(name)
        except KeyError as err:  # UnknownNameError; pydantic wants a ValueError
            raise ValueError(str(err)) from None
    return name


class KLControlConfig(StrictModel):
    """``algorithm.kl_ctrl``: the coefficient of the in-reward KL penalty and how it adapts."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """fixed: constant kl_coef; adaptive: proportional controller towards target_kl (Ziegler et al.)."""
    kl_coef: float = Field(0.001, ge=0.0)
    """Initial (fixed: constant) coefficient beta of the KL penalty subtracted from the reward."""
    target_kl: float = Field(0.1, gt=0.0)
    """Adaptive: the KL per sequence the controller steers towards."""
    horizon: int = Field(10000, gt=0)
    """Adaptive: samples over which a 20% KL error changes beta by 20%."""


ROLLOUT_CORRECTION_PRESETS: dict[str, dict[str, Any]] = {
    "token_is": {"rollout_is": "token", "rollout_is_threshold": "2.0"},
    "seq_is": {"rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "k3_rs": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
    "token_k1_seq_mean_k3_rs": {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "5.0,0.01"},
    "token_is_k3_rs": {
        "rollout_is": "token",
        "rollout_is_threshold": "2.0",
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": "0.01",
    },
    "bypass": {"bypass_mode": True},
}
"""Ready-made rollout-correction settings; explicit fields override the preset's."""


class RolloutCorrectionConfig(StrictModel):
    """``algorithm.rollout_correction``: IS / RS against the rollout engine's log-probs (R-7.4, R-7.5)."""

    preset: str | None = None
    """Name from ROLLOUT_CORRECTION_PRESETS filling the fields below (explicit fields win)."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Importance-sampling level: token, sequence (ratio of the whole response), or null (off)."""
    rollout_is_threshold: str = "2.0"
    """"u" = TIS (truncate above u); "lo_hi" = IcePop (zero outside); quote pairs in YAML (0.5_2 reads as 0.52)."""
    rollout_is_batch_normalize: bool = False
    """Rescale the IS weights so that their mean over the batch is 1."""
    rollout_rs: str | None = None
    """Rejection-sampling options, comma-separated and ANDed, e.g. "token_k1,seq_mean_k3"; null = off."""
    rollout_rs_threshold: str | None = None
    """One bound per RS option (or one for all), quoted: "lo_hi" or u; k1 bounds pi_rollout / pi_old, u = [1/u, u]."""
    bypass_mode: bool = False
    """Use the rollout log-probs as old_log_prob (no recomputation); needs rollout log-probs."""
    bypass_current_version: bool = False
    """A trajectory whose every token came from pi_old's weights (the version the step's local
    update 0 trains from) takes its rollout log-probs as old_log_prob; the rest are recomputed.
    Only sound where both engines give the same numbers; the async modes default it to true there."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        name = data["preset"]
        if name not in ROLLOUT_CORRECTION_PRESETS:
            raise ValueError(
                f"unknown rollout-correction preset {name!r}; available: {', '.join(ROLLOUT_CORRECTION_PRESETS)}"
            )
        return {**ROLLOUT_CORRECTION_PRESETS[name], **data}

    @field_validator("rollout_is_threshold", "rollout_rs_threshold", mode="before")
    @classmethod
    def _number_to_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("rollout_is_threshold")
    @classmethod
    def _check_is_threshold(cls, value: str) -> str:
        parse_is_threshold(value)
        return value

    @model_validator(mode="after")
    def _check_rs(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None:
            parse_rs_rules(self.rollout_rs, self.rollout_rs_threshold)
        return self


class AlgorithmConfig(StrictModel):
    adv_estimator: str = "grpo"
    """Registered advantage estimator (rl_train.algorithms.advantage.ADV_ESTIMATORS)."""
    norm_adv_by_std_in_grpo: bool = True
    """grpo, grpo_passk: divide the group-centred reward by the group's (unbiased) std (gpg never does)."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount factor for token-level estimators (GAE, REINFORCE++)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE lambda."""
    kl_in_reward: bool = False
    """Subtract beta * KL(policy || ref) from the token rewards before the advantage (needs the ref phase)."""
    kl_penalty: KlEstimator = "k1"
    """KL estimator used for the in-reward penalty."""
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    """Coefficient controller of the in-reward KL penalty."""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    """Rollout correction (IS / RS / bypass) against the rollout engine's log-probs."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: a trajectory cut at the length limit (stop_reason "length")
    keeps its reward in its group's baseline but trains none of its tokens."""
    overlong_penalty: float = Field(0.0, ge=0.0)
    """Subtracted from the score of a trajectory cut at the length limit before its advantage
    (the reported reward stays the task's): in a group with no right answer it still tells a
    run-on from a finished wrong answer, where the bare scores are all equal and teach nothing."""

    @field_validator("adv_estimator")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        return _check_registered("rl_train.algorithms.advantage", "ADV_ESTIMATORS", name)


PER_MICRO_BATCH_LOSSES = ("clip_cov", "kl_cov")
"""Policy losses whose statistics are taken per micro-batch (``policy_loss_cov``): which rows
share a micro-batch changes what they train."""


class PolicyLossConfig(StrictModel):
    policy_loss: str = "vanilla"
    """Registered policy loss (rl_train.algorithms.policy_loss.POLICY_LOSSES)."""
    clip_ratio_low: float = Field(0.2, ge=0.0, lt=1.0)
    """PPO clip: lower bound of the ratio is 1 - clip_ratio_low."""
    clip_ratio_high: float = Field(0.2, ge=0.0)
    """PPO clip: upper bound of the ratio is 1 + clip_ratio_high (DAPO clip-higher when larger)."""
    clip_ratio_c: float = Field(3.0, gt=1.0)
    """Dual-clip constant c: vanilla bounds negative-advantage losses by c * |A|; dppo_* truncate the ratio at c."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number; denominators are global over micro-batches and ranks."""
    loss_agg_norm_length: int | None = Field(None, gt=0)
    """seq-mean-token-sum-norm (Dr. GRPO): the constant length L; required by that mode."""
    entropy_coeff: float = Field(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    kl_loss: bool = False
    """Add a KL-to-reference penalty to the loss (needs the ref phase)."""
    kl_loss_coef: float = Field(0.0, ge=0.0)
    """Weight of the KL-to-reference loss."""
    kl_penalty: KlEstimator = "low_var_kl"
    """KL estimator used for the reference penalty."""
    clip_cov_ratio: float = Field(0.0002, gt=0.0, le=1.0)
    """clip_cov: fraction of response tokens whose gradient is detached."""
    clip_cov_lb: float = 1.0
    """clip_cov: only tokens with covariance above this are candidates."""
    clip_cov_ub: float = 5.0
    """clip_cov: only tokens with covariance below this are candidates."""
    kl_cov_ratio: float = Field(0.0002, gt=0.0, le=1.0)
    """kl_cov: fraction of response tokens (largest covariance) that get the KL penalty."""
    kl_cov_coef: float = Field(1.0, ge=0.0)
    """kl_cov: weight of |log pi - log pi_old| on the selected tokens."""
    gspo_clip_ratio_low: float = Field(3e-4, ge=0.0, lt=1.0)
    """gspo: lower clip of the sequence ratio (1 - value); GSPO uses a far tighter range than PPO."""
    gspo_clip_ratio_high: float = Field(4e-4, ge=0.0)
    """gspo: upper clip of the sequence ratio (1 + value)."""
    geo_mean_clip_ratio_low: float = Field(0.4, ge=0.0)
    """geo_mean (GMPO): token log-ratio clipped below at -value (log space)."""
    geo_mean_clip_ratio_high: float = Field(0.4, ge=0.0)
    """geo_mean (GMPO): token log-ratio clipped above at +value (log space)."""
    sapo_tau_pos: float = Field(1.0, gt=0.0)
    """sapo: gate temperature for positive advantages."""
    sapo_tau_neg: float = Field(1.05, gt=0.0)
    """sapo: gate temperature for negative advantages (larger = faster decay)."""
    cispo_clip_ratio_low: float = Field(1.0, ge=0.0, le=1.0)
    """cispo: IS weight clipped below at 1 - value (1.0 = no lower clip, as in MiniMax-M1)."""
    cispo_clip_ratio_high: float = Field(0.28, ge=0.0)
    """cispo: IS weight clipped above at 1 + value."""
    dppo_tv_threshold: float = Field(0.15, gt=0.0, le=1.0)
    """dppo_tv: trust-region radius on |pi(y) - pi_old(y)| of the sampled token."""
    dppo_kl_threshold: float = Field(0.05, gt=0.0)
    """dppo_kl: trust-region radius on the binary KL(pi_old(y) || pi(y)) of the sampled token."""

    @field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        return _check_registered("rl_train.algorithms.policy_loss", "POLICY_LOSSES", name)

    @model_validator(mode="after")
    def _norm_length_given(self) -> PolicyLossConfig:
        error = norm_length_problem(self.loss_agg_mode, self.loss_agg_norm_length)
        if error:
            raise ValueError(error)
        return self


class ValueLossConfig(StrictModel):
    """Critic loss fields (flat under ``critic.*``; the critic config inherits this)."""

    cliprange_value: float = Field(0.5, gt=0.0)
    """Clipped value loss: new values are kept within +-cliprange_value of the old ones."""
    loss_agg_mode: LossAggMode = "token-mean"
    """Aggregation of the per-token value loss."""
    loss_agg_norm_length: int | None = Field(None, gt=0)
    """seq-mean-token-sum-norm: the constant length L."""
