"""Parsing of the rollout-correction option strings (no torch, so the config can use it).

Formats, as users write them in YAML:
- IS threshold: ``"2.0"`` (TIS: truncate weights above 2) or ``"0.5_2.0"`` (IcePop: zero weights
  outside [0.5, 2]).
- RS options: comma-separated names from ``RS_OPTIONS``, e.g. ``"token_k1,seq_mean_k3"``; a token or
  sequence is kept only if it passes every option (AND).
- RS thresholds: one bound spec per option, comma-separated, or a single one shared by all. A bound
  spec is ``"lo_hi"`` or a single value ``u``. For ``k1`` options the bounds are on the ratio scale
  and ``u`` means ``[1/u, u]``; for ``k2``/``k3`` (non-negative divergences) ``u`` means ``[0, u]``.

The k1 ratio is pi_rollout / pi_old (exp of k1 = log pi_rollout - log pi_old, summed or averaged),
the reference framework's convention, so that a ``"lo_hi"`` spec copied from one of its configs
rejects the same tokens. It is the inverse of the IS weight pi_old / pi_rollout: symmetric specs
(``u``, or ``1/u_u``) mean the same either way, an asymmetric one does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rl_train.registry import Registry


@dataclass(frozen=True)
class RsOption:
    """A rejection-sampling option ``<level>_<estimator>``: a statistic and how it is reduced."""

    description: str


RS_OPTIONS: Registry[RsOption] = Registry(
    "rejection-sampling option",
    "algorithm.rollout_correction.rollout_rs",
    {
        "token_k1": RsOption("reject a token when its ratio pi_rollout / pi_old = exp(-log_ratio) is outside [lo, hi]"),
        "token_k2": RsOption("reject a token when its k2 is outside [lo, hi]"),
        "token_k3": RsOption("reject a token when its k3 is outside [lo, hi]"),
        "seq_sum_k1": RsOption(
            "reject a whole sequence when the sequence ratio exp(-sum_t log_ratio) is outside [lo, hi]"
        ),
        "seq_sum_k2": RsOption("reject a whole sequence when sum_t k2 is outside [lo, hi]"),
        "seq_sum_k3": RsOption("reject a whole sequence when sum_t k3 is outside [lo, hi]"),
        "seq_mean_k1": RsOption(
            "reject a whole sequence when the geometric-mean ratio exp(-mean_t log_ratio) is outside [lo, hi]"
        ),
        "seq_mean_k2": RsOption("reject a whole sequence when mean_t k2 is outside [lo, hi]"),
        "seq_mean_k3": RsOption("reject a whole sequence when mean_t k3 is outside [lo, hi]"),
        "seq_max_k2": RsOption("reject a whole sequence when max_t k2 is outside [lo, hi]"),
        "seq_max_k3": RsOption("reject a whole sequence when max_t k3 is outside [lo, hi]"),
    },
)
"""k2 = 0.5 * log_ratio^2 and k3 = exp(log_ratio) - 1 - log_ratio per token (``rejection``); a
single threshold u means [1/u, u] for k1 and [0, u] for k2/k3."""
BOUND_FORMAT = 'a number like "2.0" or a "lower_upper" pair like "0.5_2.0"'


@dataclass(frozen=True)
class Bounds:
    """Closed interval [lower, upper]; ``lower is None`` means no lower bound."""

    lower: float | None
    upper: float


@dataclass(frozen=True)
class RejectionRule:
    """One RS option: a statistic (``level`` x ``estimator``) and the interval it must lie in.

    For k1 the interval is held in log space ([ln lo, ln hi]), as the k1 statistic is a log-ratio:
    comparing there needs no exp, so no clamp can move a statistic across a bound.
    """

    level: str
    estimator: str
    bounds: Bounds


def _parse_float(text: str, context: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{context}: {text!r} is not a number; expected {BOUND_FORMAT}") from None
    if not math.isfinite(value):
        raise ValueError(f"{context}: {text!r} must be finite; expected {BOUND_FORMAT}")
    return value


def split_bounds(spec: str | float, context: str) -> tuple[float | None, float]:
    """``"u"`` -> (None, u); ``"lo_hi"`` -> (lo, hi), with 0 <= lo < hi and hi > 0."""
    parts = str(spec).strip().split("_")
    if len(parts) == 1:
        upper = _parse_float(parts[0], context)
        if upper <= 0:
            raise ValueError(f"{context}: {spec!r} must be > 0; expected {BOUND_FORMAT}")
        return None, upper
    if len(parts) != 2:
        raise ValueError(f"{context}: cannot parse {spec!r}; expected {BOUND_FORMAT}")
    lower, upper = (_parse_float(p, context) for p in parts)
    if not 0 <= lower < upper:
        raise ValueError(f"{context}: {spec!r} needs 0 <= lower < upper; expected {BOUND_FORMAT}")
    return lower, upper


def parse_is_threshold(spec: str | float) -> Bounds:
    """IS bounds: single value = TIS upper bound, pair = IcePop window."""
    lower, upper = split_bounds(spec, "rollout_is_threshold")
    return Bounds(lower, upper)


def parse_rs_options(spec: str) -> list[tuple[str, str]]:
    """``"token_k1,seq_mean_k3"`` -> [("token", "k1"), ("seq_mean", "k3")]; an unknown name
    lists the ``RS_OPTIONS``."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise ValueError(f"empty option list; expected comma-separated names from {', '.join(RS_OPTIONS)}")
    out = []
    for name in names:
        level, estimator = RS_OPTIONS.check(name).rsplit("_", 1)
        out.append((level, estimator))
    return out


def _rule_bounds(estimator: str, spec: str, context: str) -> Bounds:
    """k2/k3: the bounds as given; k1: ratio bounds on pi_rollout / pi_old, returned in log space."""
    lower, upper = split_bounds(spec, context)
    if estimator != "k1":
        return Bounds(lower, upper)
    if lower is None:
        if upper <= 1:
            raise ValueError(f"{context}: a single k1 bound u means [1/u, u] and needs u > 1, got {spec!r}")
        return Bounds(-math.log(upper), math.log(upper))
    if lower <= 0:
        raise ValueError(f"{context}: k1 bounds are ratios and need lower > 0, got {spec!r}")
    return Bounds(math.log(lower), math.log(upper))


def parse_rs_rules(options: str, thresholds: str | float | None) -> list[RejectionRule]:
    """Pair every RS option with its bounds (one shared spec, or one per option)."""
    parsed = parse_rs_options(options)
    if thresholds is None:
        raise ValueError(f"rollout_rs_threshold is required when rollout_rs is set; expected {BOUND_FORMAT}")
    specs = [s.strip() for s in str(thresholds).split(",")]
    if len(specs) == 1:
        specs = specs * len(parsed)
    if len(specs) != len(parsed):
        raise ValueError(
            f"rollout_rs_threshold: {len(specs)} thresholds for {len(parsed)} options; give one per option "
            f"(comma-separated, same order) or a single one for all"
        )
    return [
        RejectionRule(level, est, _rule_bounds(est, spec, f"rollout_rs_threshold for {level}_{est}"))
        for (level, est), spec in zip(parsed, specs, strict=True)
    ]
