"""Advantage estimators by name: the ``ADV_ESTIMATORS`` table, and what each one reads.

Outcome (group-baseline) estimators live in ``advantage_outcome``, token-level ones in
``advantage_token``; their inputs and helpers in ``advantage_base``. The table names each
by import path, so the config checks a name, and asks what its estimator reads, without
importing torch; the estimator itself is imported when the advantage phase is built.
An estimator that reads more than rewards, masks and groups says so in its entry
(``EstimatorNeeds``): the step plan then runs the phase that writes that input, and a
config that cannot feed its estimator fails at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.algorithms.advantage_base import AdvantageFn  # noqa: F401 (the quoted base class below)


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator reads beyond rewards, masks and groups.

    The run's step plan and the config read this, so the phase that produces an input runs
    exactly when the configured estimator reads it, and a config that cannot feed its
    estimator fails at load instead of at the first advantage phase.
    """

    critic: bool = False
    """``values`` from a critic: the values and critic_update phases run (R-3.1 steps 6 and 8)."""
    greedy_baseline: bool = False
    """``reward_baselines``: the reward of one greedy response per prompt (the greedy_baseline phase)."""


@dataclass(frozen=True)
class Estimator(Entry["AdvantageFn"]):
    """An advantage estimator (its description: the function's docstring) and what it reads."""

    needs: EstimatorNeeds = field(default_factory=EstimatorNeeds)


_OUTCOME = "rl_train.algorithms.advantage_outcome:"
_TOKEN = "rl_train.algorithms.advantage_token:"

ADV_ESTIMATORS: Registry[Estimator] = Registry(
    "advantage estimator",
    "algorithm.adv_estimator",
    {
        "grpo": Estimator(_OUTCOME + "compute_grpo_advantage"),
        "grpo_passk": Estimator(_OUTCOME + "compute_grpo_passk_advantage"),
        "rloo": Estimator(_OUTCOME + "compute_rloo_advantage"),
        "opo": Estimator(_OUTCOME + "compute_opo_advantage"),
        "gpg": Estimator(_OUTCOME + "compute_gpg_advantage"),
        "reinforce_plus_plus_baseline": Estimator(_OUTCOME + "compute_reinforce_plus_plus_baseline_advantage"),
        # values from the critic (R-3.1 steps 6, 8)
        "gae": Estimator(_TOKEN + "compute_gae_advantage", needs=EstimatorNeeds(critic=True)),
        "reinforce_plus_plus": Estimator(_TOKEN + "compute_reinforce_plus_plus_advantage"),
        # one greedy answer per prompt
        "remax": Estimator(_TOKEN + "compute_remax_advantage", needs=EstimatorNeeds(greedy_baseline=True)),
    },
)


def outcome_estimators() -> list[str]:
    """The estimators that give one advantage per trajectory (the outcome ones: a group
    baseline, broadcast over the response), which groupwise grading (GAR) can reshape."""
    return [name for name in ADV_ESTIMATORS.names() if ADV_ESTIMATORS[name].module == _OUTCOME.rstrip(":")]


def estimator_needs(name: str) -> EstimatorNeeds:
    """What the estimator registered as ``name`` reads beyond rewards, masks and groups."""
    return ADV_ESTIMATORS[name].needs
