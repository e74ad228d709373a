"""Advantage estimators by name: the ``ADV_ESTIMATORS`` table, and what each one reads.

Outcome (group-baseline) estimators live in ``advantage_outcome``, token-level ones in
``advantage_token``; their inputs and helpers in ``advantage_base``. This module imports
them and builds the tables; none imports it back, so any of them can be imported first.
An estimator that reads more than rewards, masks and groups declares it here
(``ESTIMATOR_NEEDS``): the step plan then runs the phase that writes that input, and a config
that cannot feed its estimator fails at load. A user's own estimator registers with
``ADV_ESTIMATORS.register(name)`` and ``declare_needs(fn, needs)``.
"""

from __future__ import annotations

from rl_train.algorithms.advantage_base import (
    AdvantageFn,
    AdvantageInputs,
    EstimatorNeeds,
    broadcast_to_tokens,
    group_indices,
    outcome_advantage,
    sequence_scores,
    session_representatives,
)
from rl_train.algorithms.advantage_outcome import (
    compute_gpg_advantage,
    compute_grpo_advantage,
    compute_grpo_passk_advantage,
    compute_opo_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
    compute_rloo_advantage,
)
from rl_train.algorithms.advantage_token import (
    compute_gae_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_remax_advantage,
)
from rl_train.registry import Registry

__all__ = [
    "ADV_ESTIMATORS",
    "AdvantageFn",
    "AdvantageInputs",
    "EstimatorNeeds",
    "broadcast_to_tokens",
    "compute_grpo_advantage",
    "declare_needs",
    "estimator_needs",
    "group_indices",
    "outcome_advantage",
    "sequence_scores",
    "session_representatives",
]

ADV_ESTIMATORS: Registry[AdvantageFn] = Registry.from_table(
    "advantage estimator",
    {
        "grpo": compute_grpo_advantage,
        "grpo_passk": compute_grpo_passk_advantage,
        "rloo": compute_rloo_advantage,
        "opo": compute_opo_advantage,
        "gpg": compute_gpg_advantage,
        "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_advantage,
        "gae": compute_gae_advantage,
        "reinforce_plus_plus": compute_reinforce_plus_plus_advantage,
        "remax": compute_remax_advantage,
    },
)

_NEEDS: dict[AdvantageFn, EstimatorNeeds] = {
    compute_gae_advantage: EstimatorNeeds(critic=True),  # values from the critic (R-3.1 steps 6, 8)
    compute_remax_advantage: EstimatorNeeds(greedy_baseline=True),  # one greedy answer per prompt
}


def declare_needs(fn: AdvantageFn, needs: EstimatorNeeds) -> None:
    """Declare what a (user-registered) estimator reads beyond rewards, masks and groups."""
    _NEEDS[fn] = needs


def estimator_needs(name: str) -> EstimatorNeeds:
    """The needs declared by the estimator registered as ``name`` (none declared: none)."""
    return _NEEDS.get(ADV_ESTIMATORS.get(name), EstimatorNeeds())
