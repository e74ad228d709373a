"""Where the reward pool runs (``reward.device``, ``reward.placement``): its placement plan, the
sleep and wake of a colocated reward model around scoring (R-6.8), separate_async's refusal of
a reward model that shares the rollout's devices (R-2.6), and a ``Trajectory`` that pickles."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from pydantic import Field

import rl_train.engines.reward.config as reward_config
from rl_train.algorithms.config import StrictModel
from rl_train.config import ConfigError, load_config
from rl_train.engines.reward.base import (
    FrozenMapping,
    ModelReward,
    RewardResult,
    Trajectory,
    freeze,
)
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.workers.placement import COLOCATED_REWARD_GPU, Slot, plan_placement
from rl_train.modes import MODES

CALLS: list[str] = []
"""What the fake reward model below was asked, in order."""


class RecordingRewardModel:
    """The edge of the world: a reward that holds a model, and records its sleeps, wakes and
    scorings (named by import path in the tests' config, as a user's reward is)."""

    device = "cpu"

    def __init__(self) -> None:
        self.awake = True

    def sleep(self) -> None:
        CALLS.append("sleep")
        self.awake = False

    def wake_up(self) -> None:
        CALLS.append("wake_up")
        self.awake = True

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        assert self.awake, "scored while asleep"
        CALLS.append(f"score {len(trajectories)}")
        return [RewardResult(float(t.response == t.ground_truth)) for t in trajectories]


MODEL = f"{__name__}:RecordingRewardModel"


def _trajectories(*answers: str) -> list[Trajectory]:
    return [
        Trajectory.of_answer({"prompt": "1+1", "data_source": "rm", "ground_truth": "2"}, a) for a in answers
    ]


def test_the_fake_is_a_model_reward() -> None:
    assert isinstance(RecordingRewardModel(), ModelReward)


def test_a_colocated_reward_model_sleeps_once_built_and_wakes_only_to_score() -> None:
    CALLS.clear()
    router = RewardRouter(RewardConfig(by_data_source={"rm": MODEL}, placement="colocate"))
    router.build_configured()
    assert CALLS == ["sleep"]  # the rollout's device is the rollout's until it scores
    results = router.score(_trajectories("2", "3"))
    assert [r.score for r in results] == [1.0, 0.0]
    router.score(_trajectories("2"))
    assert CALLS == ["sleep", "wake_up", "score 2", "sleep", "wake_up", "score 1", "sleep"]


def test_a_colocated_reward_model_goes_back_to_sleep_when_scoring_raises() -> None:
    CALLS.clear()
    router = RewardRouter(RewardConfig(by_data_source={"rm": MODEL}, placement="colocate"))
    bad = Trajectory.of_answer({"prompt": "p", "data_source": "rm", "ground_truth": "2"}, "2")
    reward = router.reward(MODEL)
    reward.score_batch = lambda trajectories: 1 / 0  # type: ignore[method-assign,union-attr]
    with pytest.raises(ZeroDivisionError):
        router.score([bad])
    assert CALLS == ["sleep", "wake_up", "sleep"]


def test_a_reward_model_in_its_own_pool_stays_awake() -> None:
    CALLS.clear()
    router = RewardRouter(RewardConfig(by_data_source={"rm": MODEL}))
    router.score(_trajectories("2"))
    assert CALLS == ["score 1"]


# -- placement ----------------------------------------------------------------------------
def test_cpu_reward_workers_reserve_nothing() -> None:
    plan = plan_placement(load_config(overrides=["reward.num_workers=2"]))
    assert plan.rewards == [Slot(), Slot()] and "rewards" not in plan.groups


def test_cuda_reward_workers_in_their_own_pool_get_a_gpu_bundle_each() -> None:
    plan = plan_placement(load_config(overrides=["reward.num_workers=2", "reward.device=cuda"]))
    assert plan.groups["rewards"] == ([{"GPU": 1.0}] * 2, "PACK")
    assert plan.rewards == [Slot(1.0, "rewards", 0), Slot(1.0, "rewards", 1)]


def test_colocated_cuda_reward_workers_take_a_share_of_the_rollouts_bundles() -> None:
    overrides = [
        "trainer.mode=separate_async",
        "actor.device=cuda",
        "rollout.device=cuda",
        "rollout.num_replicas=2",
    ]
    plan = plan_placement(
        load_config(overrides=[*overrides, "reward.device=cuda", "reward.placement=colocate"])
    )
    assert plan.rewards == [Slot(COLOCATED_REWARD_GPU, "rollouts", 0)]
    # the replica that hosts it asks that much less of its GPU; the other keeps a whole one
    assert plan.rollouts == [Slot(1.0 - COLOCATED_REWARD_GPU, "rollouts", 0), Slot(1.0, "rollouts", 1)]
    assert "rewards" not in plan.groups


def test_colocating_a_cuda_reward_with_a_cpu_rollout_is_refused_by_name() -> None:
    config = load_config(overrides=["reward.device=cuda", "reward.placement=colocate"])
    with pytest.raises(ValueError, match="reward.placement: 'colocate' on reward.device 'cuda'"):
        plan_placement(config)


# -- separate_async (R-2.6) ---------------------------------------------------------------
class ModelEntry(StrictModel):
    """A section entry that defines a reward holding a model (as reward.models' will)."""

    holds_model: ClassVar[bool] = True
    path: str = "rm"

    def build(self, name: str, settings: Any) -> Any:
        return RecordingRewardModel()


class RuleEntry(StrictModel):
    holds_model: ClassVar[bool] = False

    def build(self, name: str, settings: Any) -> Any:
        return lambda trajectory: 1.0


class SectionedRewardConfig(RewardConfig):
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    rules: dict[str, RuleEntry] = Field(default_factory=dict)


def test_the_defined_rewards_that_hold_a_model_are_named_by_their_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reward_config, "DEFINING_SECTIONS", ("models", "rules"))
    config = SectionedRewardConfig.model_validate({"models": {"my_rm": {}}, "rules": {"mine": {}}})
    assert config.model_rewards() == ["reward.models.my_rm"]


def test_separate_async_refuses_a_reward_model_colocated_with_the_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = ["trainer.mode=separate_async", "reward.placement=colocate"]
    load_config(overrides=overrides)  # no reward holds a model: nothing to refuse
    monkeypatch.setattr(RewardConfig, "model_rewards", lambda self: ["reward.models.my_rm"])
    with pytest.raises(
        ConfigError,
        match=r"reward.placement: got 'colocate' with model-based rewards \(reward.models.my_rm\)",
    ):
        load_config(overrides=overrides)
    assert MODES["separate_async"].check(load_config(overrides=["trainer.mode=separate_async"])) == []
    assert (
        MODES["colocate_async"].check(
            load_config(overrides=["trainer.mode=colocate_async", "reward.placement=colocate"])
        )
        == []
    )


def test_streaming_is_on_by_default_in_the_async_modes_only() -> None:
    assert not load_config(overrides=["trainer.mode=sync"]).reward.streaming
    for mode in ("colocate_async", "separate_async"):
        assert load_config(overrides=[f"trainer.mode={mode}"]).reward.streaming
    assert not load_config(
        overrides=["trainer.mode=separate_async", "reward.streaming=false"]
    ).reward.streaming


# -- pickling -----------------------------------------------------------------------------
def test_a_trajectory_with_nested_extra_fields_pickles_and_stays_read_only() -> None:
    row = {
        "prompt": "p",
        "data_source": "d",
        "ground_truth": "1",
        "meta": {"tests": ["assert f()"], "k": {"x": 1}},
    }
    trajectory = Trajectory.of_answer(row, "1")
    copy = pickle.loads(pickle.dumps(trajectory))
    assert copy == trajectory and copy.extra["meta"]["k"]["x"] == 1
    assert isinstance(copy.extra, FrozenMapping) and copy.extra["meta"]["tests"] == ("assert f()",)
    with pytest.raises(TypeError):
        copy.extra["meta"]["k"]["x"] = 2  # type: ignore[index]
    assert not hasattr(copy.extra, "__setitem__") and not hasattr(copy.extra, "update")


def test_freeze_copies_so_the_row_cannot_change_what_a_reward_reads() -> None:
    row: dict[str, Any] = {"a": [1, 2]}
    frozen = freeze(row)
    row["a"].append(3)
    row["b"] = 0
    assert dict(frozen) == {"a": (1, 2)} and frozen == {"a": (1, 2)}


def test_separate_async_refuses_a_colocated_judge_and_takes_it_in_its_own_pool() -> None:
    judge = ["reward.judges.j.model_path=models/judge", "reward.by_data_source.arith=j"]
    with pytest.raises(ConfigError, match=r"reward.placement: got 'colocate' with model-based rewards \(reward.judges.j\)"):
        load_config(overrides=["trainer.mode=separate_async", "reward.placement=colocate", *judge])
    config = load_config(overrides=["trainer.mode=separate_async", *judge])
    assert config.reward.placement == "own_pool" and config.reward.model_rewards() == ["reward.judges.j"]
