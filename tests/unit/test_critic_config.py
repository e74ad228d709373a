"""The critic's config (``critic.*``) and the estimator needs that switch the optional phases on.

No registered estimator may fail at run time for want of a phase: each declares what it reads
(``EstimatorNeeds``), the step plan runs the phases that write it, and a config whose switches
contradict the estimator fails at load with the dotted path.
"""

from __future__ import annotations

import pytest
import torch

from rl_train.algorithms.advantage import ADV_ESTIMATORS, EstimatorNeeds, estimator_needs
from rl_train.algorithms.advantage_base import AdvantageInputs
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.config import Config, ConfigError, load_config
from rl_train.flows.step import StepPlan


def test_estimators_declare_the_inputs_their_phases_produce() -> None:
    assert estimator_needs("gae") == EstimatorNeeds(critic=True)
    assert estimator_needs("remax") == EstimatorNeeds(greedy_baseline=True)
    assert estimator_needs("grpo") == EstimatorNeeds()


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_estimator_runs_on_what_the_step_plan_gives_it(name: str) -> None:
    """The inputs a run provides follow from the estimator's declared needs: with them it runs,
    and an estimator that reads something it did not declare fails here, not in a run."""
    needs = estimator_needs(name)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    inputs = AdvantageInputs(
        rewards,
        mask,
        ["g", "g"],
        values=torch.full_like(rewards, 0.5) if needs.critic else None,
        reward_baselines=torch.tensor([0.5, 0.5]) if needs.greedy_baseline else None,
    )
    advantages, returns = ADV_ESTIMATORS.get(name)(inputs, AlgorithmConfig(adv_estimator=name))
    assert advantages.shape == returns.shape == rewards.shape
    assert torch.isfinite(advantages).all()


@pytest.mark.parametrize(
    ("estimator", "critic", "greedy"), [("gae", True, False), ("remax", False, True), ("grpo", False, False)]
)
def test_critic_enable_follows_the_estimator(estimator: str, critic: bool, greedy: bool) -> None:
    cfg = load_config(
        None, [f"algorithm.adv_estimator={estimator}", "actor.kl_loss=true", "actor.kl_loss_coef=0.1"]
    )
    assert cfg.critic.enable is critic
    assert StepPlan.from_config(cfg) == StepPlan(ref=True, critic=critic, greedy_baseline=greedy)
    # The resolved config states the switch, so a process that rejoins the run reads the same.
    assert Config.model_validate(cfg.model_dump(mode="json")).critic.enable is critic


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["algorithm.adv_estimator=gae", "critic.enable=false"],
            "critic.enable is false but algorithm.adv_estimator 'gae'",
        ),
        (
            ["critic.enable=true"],
            "critic.enable is true but algorithm.adv_estimator 'grpo' reads no critic values",
        ),
        (
            ["algorithm.adv_estimator=remax", "critic.enable=true"],
            "algorithm.adv_estimator 'remax' reads no critic values",
        ),
        (
            ["algorithm.adv_estimator=gae", "trainer.train_batch_size=12", "critic.ppo_mini_batch_size=5"],
            r"critic.ppo_mini_batch_size \(5\) must divide the groups of one local update",
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.loss_agg_mode=seq-mean-token-sum-norm"],
            "critic: loss_agg_mode seq-mean-token-sum-norm needs loss_agg_norm_length",
        ),
        (["critic.lr=0"], "critic.lr: got 0"),
        (["critic.nonsense=1"], "critic.nonsense: unknown key"),
    ],
)
def test_impossible_critic_settings_fail_at_load(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, overrides)


def test_critic_epochs_and_mini_batches_default_to_the_actors() -> None:
    cfg = load_config(
        None, ["algorithm.adv_estimator=gae", "actor.ppo_mini_batch_size=4", "actor.ppo_epochs=2"]
    )
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_epochs) == (4, 2)
    own = load_config(
        None, ["algorithm.adv_estimator=gae", "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=8"]
    )
    assert own.critic.ppo_mini_batch_size == 8
    whole = load_config(None, ["algorithm.adv_estimator=gae"])
    assert (whole.critic.ppo_mini_batch_size, whole.critic.ppo_epochs) == (None, 1)  # one step per update
