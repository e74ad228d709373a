"""Every trainer mode has a deployment whose pinned mode loads as a valid config."""

from __future__ import annotations

import pytest

from rl_train.config import load_config
from rl_train.deployments.serve import DEPLOYMENT_MODES, build_deployments, deployment_parameters
from rl_train.flows.train import resolve_config
from rl_train.modes import MODES


def test_each_registered_mode_has_a_deployment() -> None:
    assert sorted(DEPLOYMENT_MODES.values()) == MODES.names()
    assert {d.name for d in build_deployments()} == {"sync", "colocate", "separate"}


@pytest.mark.parametrize("mode", sorted(DEPLOYMENT_MODES.values()))
def test_deployment_parameters_load_and_pin_the_mode_past_a_runs_overrides(mode: str) -> None:
    params = deployment_parameters(mode)
    overrides = ["trainer.mode=sync", "trainer.total_steps=3"]  # a run's own list replaces the default
    config = resolve_config(params["config"], overrides, None, params["mode"])
    assert config.trainer.mode == mode and config.trainer.total_steps == 3
    deployment = next(d for d in build_deployments() if d.parameters["mode"] == mode)
    assert deployment.parameters == params


def test_separate_async_defaults_apply_only_where_the_user_set_nothing() -> None:
    config = load_config(None, ["trainer.mode=separate_async"])
    assert config.trainer.parameter_sync_step == 4
    assert config.rollout.weight_sync.backend == "bucketed"
    assert config.replay.max_off_policy_threshold == 5  # at most 4 versions behind
    derived = load_config(None, ["trainer.mode=separate_async", "trainer.parameter_sync_step=2"])
    assert derived.replay.max_off_policy_threshold == 3  # follows the user's parameter_sync_step
    config = load_config(
        None,
        ["trainer.mode=separate_async", "trainer.parameter_sync_step=2", "rollout.weight_sync.backend=delta"],
    )
    assert config.trainer.parameter_sync_step == 2 and config.rollout.weight_sync.backend == "delta"
    colocate = load_config(None, ["trainer.mode=colocate_async"])
    assert colocate.trainer.parameter_sync_step == 1
    assert colocate.replay.max_off_policy_threshold == 2  # at most 1 version behind
    assert (
        load_config(
            None, ["trainer.mode=colocate_async", "replay.max_off_policy_threshold=8"]
        ).replay.max_off_policy_threshold
        == 8
    )
    sync = load_config(None, [])
    assert sync.trainer.parameter_sync_step == 1 and sync.replay.max_off_policy_threshold == 8


@pytest.mark.parametrize(
    ("overrides", "bypass"),
    [
        ([], True),  # the built-in torch engines, float32 on the CPU, whole-distribution sampling
        (["actor.dtype=bfloat16"], False),
        (["rollout.top_p=0.9"], False),
        (["rollout.engine=sglang"], False),
        (["actor.engine=megatron"], False),
        (["rollout.device=cuda"], False),
        (["algorithm.rollout_correction.rollout_is=token"], False),  # the user's own correction
        (["algorithm.rollout_correction.bypass_mode=false"], False),
        (["trainer.mode=colocate_async"], False),  # stale samples are corrected instead (token_is)
    ],
)
def test_sync_reuses_the_rollout_log_probs_only_where_they_are_the_trainers(
    overrides: list[str], bypass: bool
) -> None:
    """R-7.1: old_log_prob is recomputed unless the two engines give the same numbers."""
    config = load_config(None, overrides)
    assert config.algorithm.rollout_correction.bypass_mode is bypass
    demo = load_config("configs/arith-tiny.yaml", [])
    assert demo.algorithm.rollout_correction.bypass_mode
    assert not load_config("configs/arith-tiny.yaml", ["trainer.mode=colocate_async"]).algorithm.rollout_correction.bypass_mode


@pytest.mark.parametrize(
    ("overrides", "copied"),
    [
        (["trainer.mode=separate_async"], True),  # the built-in torch engines, float32 on the CPU
        (["trainer.mode=colocate_async"], True),
        (["trainer.mode=separate_async", "actor.dtype=bfloat16"], False),
        (["trainer.mode=separate_async", "rollout.top_p=0.9"], False),
        (["trainer.mode=separate_async", "rollout.engine=sglang"], False),
        (["trainer.mode=separate_async", "algorithm.rollout_correction.bypass_current_version=false"], False),
        (["trainer.mode=separate_async", "algorithm.rollout_correction.rollout_is=sequence"], True),  # orthogonal
        ([], False),  # sync copies every trajectory's instead (bypass_mode)
        # colocate_async does not pin pi_old: past local update 0 it is the current weights
        (["trainer.mode=colocate_async", "trainer.parameter_sync_step=2", "trainer.train_batch_size=8"], False),
        (["trainer.mode=separate_async", "actor.fsdp=true", "actor.num_ranks=2"], False),  # passes are collectives
    ],
)
def test_async_modes_copy_pi_olds_own_trajectories_only_where_the_numbers_are_the_trainers(
    overrides: list[str], copied: bool
) -> None:
    """A trajectory pi_old's weights sampled needs no recompute only where the two engines give
    the same numbers (R-7.1); the IS and RS settings do not change that."""
    config = load_config(None, overrides)
    assert config.algorithm.rollout_correction.bypass_current_version is copied


def test_copying_pi_olds_trajectories_is_refused_beside_r2_router_replay() -> None:
    with pytest.raises(ValueError, match=r"bypass_current_version: got true: actor.router_replay r2 replays"):
        load_config(
            None,
            [
                "actor.engine=megatron",
                "actor.router_replay=r2",
                "algorithm.rollout_correction.bypass_current_version=true",
            ],
        )


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["trainer.mode=colocate_async", "trainer.parameter_sync_step=2"], "does not pin pi_old"),
        (["trainer.parameter_sync_step=2"], "sync does not pin pi_old"),
        (["trainer.mode=separate_async", "actor.fsdp=true", "actor.num_ranks=2"], "a model split over its ranks"),
    ],
)
def test_copying_pi_olds_trajectories_is_refused_where_a_copy_is_not_pi_olds(overrides: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=f"bypass_current_version: got true with .*{why}"):
        load_config(None, [*overrides, "trainer.train_batch_size=8", "algorithm.rollout_correction.bypass_current_version=true"])
    # separate_async pins pi_old to local update 0's weights (R-2.8): its four local updates copy
    assert load_config(
        None, ["trainer.mode=separate_async", "algorithm.rollout_correction.bypass_current_version=true"]
    ).algorithm.rollout_correction.bypass_current_version
