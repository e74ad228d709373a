"""Every trainer mode has a deployment whose pinned overrides load as a valid config."""

from __future__ import annotations

import pytest

from rl_train.config import load_config
from rl_train.deployments.serve import DEPLOYMENT_MODES, build_deployments, deployment_overrides
from rl_train.flows.registry import TRAINERS, load_builtin_trainers


def test_each_registered_mode_has_a_deployment() -> None:
    load_builtin_trainers()
    assert sorted(DEPLOYMENT_MODES.values()) == TRAINERS.names()
    assert {d.name for d in build_deployments()} == {"sync", "colocate", "separate"}


@pytest.mark.parametrize("mode", sorted(DEPLOYMENT_MODES.values()))
def test_deployment_overrides_load(mode: str) -> None:
    config = load_config(None, deployment_overrides(mode))
    assert config.trainer.mode == mode
