"""Pieces of the async modes that need no Ray: pi_old snapshots and separate_async's config checks."""

from __future__ import annotations

import pytest
import torch

from rl_train.config import Config, ConfigError, load_config
from rl_train.engines.training.snapshot import WeightSnapshots
from rl_train.flows.registry import get_trainer_class


def test_pi_old_is_bitwise_the_weights_of_local_update_zero() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    snapshots = WeightSnapshots()
    snapshots.save(model)  # local update 0
    pi_old = model(x).detach().clone()
    for _ in range(3):  # local updates 1..3 move the weights
        with torch.no_grad():
            model.weight.add_(0.1)
        trained = {k: v.clone() for k, v in model.state_dict().items()}
        with snapshots.swapped_in(model):
            assert torch.equal(model(x), pi_old)  # old_log_prob sees update 0's weights exactly
        for name, value in model.state_dict().items():
            assert torch.equal(value, trained[name])  # and the current weights come back bitwise
    snapshots.clear()
    assert not snapshots.active


SEPARATE = ["trainer.mode=separate_async", "rollout.weight_sync.backend=bucketed"]


def test_separate_async_init_validations_are_clear_config_errors() -> None:
    load_config(None, [*SEPARATE, "trainer.train_batch_size=8", "trainer.parameter_sync_step=2"])
    with pytest.raises(ConfigError, match="rollout.weight_sync.backend: 'naive'"):
        load_config(None, ["trainer.mode=separate_async", "rollout.weight_sync.backend=naive"])
    with pytest.raises(
        ConfigError, match=r"must equal trainer.parameter_sync_step \(2\) x actor.ppo_mini_batch_size \(2\)"
    ):
        load_config(
            None,
            [
                *SEPARATE,
                "trainer.train_batch_size=8",
                "trainer.parameter_sync_step=2",
                "actor.ppo_mini_batch_size=2",
            ],
        )
    config = Config.model_validate({"trainer": {"mode": "separate_async"}})  # bypassing load_config
    with pytest.raises(ConfigError, match="naive"):
        get_trainer_class("separate_async")(config)


def test_lr_horizon_is_scaled_by_parameter_sync_step() -> None:
    base = load_config(None, ["trainer.total_steps=10", "trainer.train_batch_size=8"])
    split = load_config(
        None,
        [*SEPARATE, "trainer.total_steps=10", "trainer.train_batch_size=8", "trainer.parameter_sync_step=4"],
    )
    assert base.optimizer_horizon_steps == 10 and split.optimizer_horizon_steps == 40
