"""Config of the RL algorithm: which registered estimators and losses to use, and their knobs.

``AlgorithmConfig`` is the ``algorithm.*`` section. ``PolicyLossConfig`` holds the loss fields
that live flat under ``actor.*`` (the actor config inherits it), as users of other
frameworks expect (``actor.policy_loss``, ``actor.loss_agg_mode``...). ``ValueLossConfig`` is the
same for ``critic.*``. Registered names are checked at load time against their registries, so a
typo fails with the list of available names instead of at the first training step. The
registries' tables import no torch (they name heavy implementations by import path), so
checking a name costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_train.algorithms.advantage import ADV_ESTIMATORS
from rl_train.algorithms.aggregation import AGGREGATORS
from rl_train.algorithms.kl import KL_ESTIMATORS
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.teacher_fields import DISTILL_TERMS
from rl_train.algorithms.thresholds import parse_is_threshold, parse_rs_options, parse_rs_rules
from rl_train.registry import Registry

LossAggMode = Annotated[str, AfterValidator(AGGREGATORS.check)]
"""A registered loss aggregation mode (``rl_train.algorithms.aggregation.AGGREGATORS``)."""
KlEstimator = Annotated[str, AfterValidator(KL_ESTIMATORS.check)]
"""A registered KL estimator (``rl_train.algorithms.kl.KL_ESTIMATORS``)."""


class StrictModel(BaseModel):
    """Base of every config section: unknown keys fail, every field carries a docstring."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def estimator_reads_critic(name: str) -> bool:
    """Whether the estimator ``name`` reads critic values (its ``ADV_ESTIMATORS`` entry says)."""
    return ADV_ESTIMATORS[name].needs.critic


def estimator_reads_greedy_baseline(name: str) -> bool:
    """Whether the estimator ``name`` reads a greedy baseline (the driver's step plan asks;
    the estimators and torch load in the queue actor only)."""
    return ADV_ESTIMATORS[name].needs.greedy_baseline


def _distill_term(name: str) -> str:
    if name not in DISTILL_TERMS:
        allowed = ", ".join(DISTILL_TERMS)
        raise ValueError(f"actor.distill_term {name!r} is not a distillation term; allowed: {allowed}")
    return name


def norm_length_problem(mode: str, norm_length: float | None) -> str | None:
    """Why ``mode`` cannot run without ``loss_agg_norm_length`` (None when it can)."""
    if norm_length is None and mode in AGGREGATORS and AGGREGATORS[mode].needs_norm_length:
        return (
            f"loss_agg_mode {mode} needs loss_agg_norm_length (a constant, e.g. the max "
            "response length); the padded length would make the loss depend on the micro-batch split"
        )
    return None


class KLControlConfig(StrictModel):
    """``algorithm.kl_ctrl``: the coefficient of the in-reward KL penalty and how it adapts."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """fixed: constant kl_coef; adaptive: proportional controller towards target_kl (Ziegler et al.)."""
    kl_coef: float = Field(default=0.001, ge=0.0)
    """Initial (fixed: constant) coefficient beta of the KL penalty subtracted from the reward."""
    target_kl: float = Field(default=0.1, gt=0.0)
    """Adaptive: the KL per sequence the controller steers towards."""
    horizon: int = Field(default=10000, gt=0)
    """Adaptive: samples over which a 20% KL error changes beta by 20%."""


@dataclass(frozen=True)
class Preset:
    """Ready-made rollout-correction settings; explicit fields override the preset's."""

    settings: dict[str, Any]
    summary: str

    @property
    def description(self) -> str:
        """The summary and the settings it stands for."""
        return f"{self.summary} ({', '.join(f'{key}={value}' for key, value in self.settings.items())})"


ROLLOUT_CORRECTION_PRESETS: Registry[Preset] = Registry(
    "rollout-correction preset",
    "algorithm.rollout_correction.preset",
    {
        "token_is": Preset(
            {"rollout_is": "token", "rollout_is_threshold": "2.0"},
            "token-level IS, weights truncated above 2 (TIS)",
        ),
        "seq_is": Preset(
            {"rollout_is": "sequence", "rollout_is_threshold": "2.0"},
            "sequence-level IS (ratio of the whole response), truncated above 2",
        ),
        "token_icepop": Preset(
            {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
            "token-level IcePop: weights outside [0.5, 5] set to 0",
        ),
        "k3_rs": Preset(
            {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
            "reject sequences whose token-mean k3 divergence exceeds 0.01",
        ),
        "token_k1_seq_mean_k3_rs": Preset(
            {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "5.0,0.01"},
            "reject tokens with ratio outside [1/5, 5] and sequences with token-mean k3 > 0.01",
        ),
        "token_is_k3_rs": Preset(
            {
                "rollout_is": "token",
                "rollout_is_threshold": "2.0",
                "rollout_rs": "seq_mean_k3",
                "rollout_rs_threshold": "0.01",
            },
            "`token_is` plus `k3_rs`",
        ),
        "bypass": Preset(
            {"bypass_mode": True},
            "old_log_prob := rollout log-probs (no recomputation); IS/RS metrics become trivial",
        ),
    },
)


def _known_preset(name: str | None) -> str | None:
    return None if name is None else ROLLOUT_CORRECTION_PRESETS.check(name)


class RolloutCorrectionConfig(StrictModel):
    """``algorithm.rollout_correction``: IS / RS against the rollout engine's log-probs (R-7.4, R-7.5)."""

    preset: Annotated[str | None, AfterValidator(_known_preset)] = None
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
        name = data.get("preset") if isinstance(data, dict) else None
        if not isinstance(name, str) or name not in ROLLOUT_CORRECTION_PRESETS:
            return data  # an unknown name fails on the field, under its dotted path
        return {**ROLLOUT_CORRECTION_PRESETS[name].settings, **data}

    @field_validator("rollout_is_threshold", "rollout_rs_threshold", mode="before")
    @classmethod
    def _number_to_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("rollout_is_threshold")
    @classmethod
    def _check_is_threshold(cls, value: str) -> str:
        parse_is_threshold(value)
        return value

    @field_validator("rollout_rs")
    @classmethod
    def _check_rs_options(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rs_options(value)  # unknown names fail here, under this field's dotted path
        return value

    @model_validator(mode="after")
    def _check_rs(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None:
            parse_rs_rules(self.rollout_rs, self.rollout_rs_threshold)
        return self


class AlgorithmConfig(StrictModel):
    adv_estimator: Annotated[str, AfterValidator(ADV_ESTIMATORS.check)] = "grpo"
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



PER_MICRO_BATCH_LOSSES = frozenset(name for name in POLICY_LOSSES if POLICY_LOSSES[name].per_micro_batch)
"""Policy losses whose statistics are taken per micro-batch (``policy_loss_cov``): which rows
share a micro-batch changes what they train (from their ``POLICY_LOSSES`` entries)."""


class PolicyLossConfig(StrictModel):
    policy_loss: Annotated[str, AfterValidator(POLICY_LOSSES.check)] = "vanilla"
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
    distill_coef: float = Field(1.0, ge=0.0)
    """distillation_ppo: weight of the distillation term added to the PPO loss on the task's advantages."""
    distill_term: Annotated[str, AfterValidator(_distill_term)] = "reverse_kl"
    """distillation_ppo: the distillation term, reverse_kl (PPO clip on teacher_log_prob - old_log_prob)
    or forward_kl_topk (KL from the teacher's renormalised top-k)."""

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
