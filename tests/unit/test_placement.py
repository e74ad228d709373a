"""What each pool asks Ray for, by trainer mode and device (``plan_placement`` is pure: no Ray)."""

from __future__ import annotations

from rl_train.config import load_config
from rl_train.engines.workers.placement import Slot, plan_placement


def _plan(*overrides: str):
    return plan_placement(load_config(overrides=list(overrides)))


def test_cpu_pools_reserve_nothing_and_need_no_group() -> None:
    plan = _plan("actor.num_ranks=2", "rollout.num_replicas=2")
    assert plan.groups == {}
    assert plan.trainers == [Slot(), Slot()] and plan.rollouts == [Slot(), Slot()]


def test_spread_cpu_pools_get_a_spread_group_each() -> None:
    plan = _plan("actor.num_ranks=2", "rollout.num_replicas=2", "ray.spread=true")
    assert set(plan.groups) == {"trainers", "rollouts"}
    assert all(strategy == "SPREAD" and all("GPU" not in b for b in bundles) for bundles, strategy in plan.groups.values())
    assert [s.bundle for s in plan.trainers] == [0, 1] and all(s.num_gpus == 0 for s in plan.trainers)


def test_colocated_modes_share_a_gpu_between_a_rank_and_a_replica() -> None:
    for mode in ("sync", "colocate_async"):
        plan = _plan(f"trainer.mode={mode}", "actor.device=cuda", "rollout.device=cuda", "actor.num_ranks=2",
                     "rollout.num_replicas=2")  # fmt: skip
        assert plan.groups == {"colocated": ([{"GPU": 1.0}] * 2, "PACK")}
        assert plan.trainers == [Slot(0.5, "colocated", 0), Slot(0.5, "colocated", 1)]
        assert plan.rollouts == [Slot(0.5, "colocated", 0), Slot(0.5, "colocated", 1)]


def test_separate_async_rollouts_get_gpus_of_their_own() -> None:
    """R-2.6: the standalone rollout pool runs on its own devices."""
    plan = _plan("trainer.mode=separate_async", "actor.device=cuda", "rollout.device=cuda", "rollout.num_replicas=2")
    assert plan.groups == {"trainers": ([{"GPU": 1.0}], "PACK"), "rollouts": ([{"GPU": 1.0}] * 2, "PACK")}
    assert plan.trainers == [Slot(1.0, "trainers", 0)]
    assert plan.rollouts == [Slot(1.0, "rollouts", 0), Slot(1.0, "rollouts", 1)]


def test_a_cuda_pool_beside_a_cpu_one_asks_gpus_for_itself_only() -> None:
    plan = _plan("actor.device=cuda", "ray.spread=true")
    assert plan.groups == {"trainers": ([{"GPU": 1.0}], "SPREAD")}
    assert plan.trainers == [Slot(1.0, "trainers", 0)] and plan.rollouts == [Slot()]
