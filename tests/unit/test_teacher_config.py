"""The ``teacher`` section (R-4.10): a distillation loss needs a teacher with what it reads, a
teacher needs a loss that reads it, its directory is checked before a run, and its workers are
placed by the reward pool's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.teacher.config import check_teacher_path
from rl_train.engines.workers.placement import COLOCATED_REWARD_GPU, Slot, plan_placement
from rl_train.engines.workers.teacher_pool import TeacherPool, num_teacher_workers
from rl_train.flows.step import StepPlan

TEACHER = "teacher.path=runs/arith-tiny/policy"


@pytest.mark.parametrize("loss", ["reverse_kl", "forward_kl_topk", "distillation_ppo"])
def test_a_distillation_loss_without_a_teacher_is_refused_by_name(loss: str) -> None:
    with pytest.raises(ConfigError, match=f"actor.policy_loss '{loss}' trains on a teacher's scores: set teacher.path"):
        load_config(overrides=[f"actor.policy_loss={loss}"])


def test_a_teacher_no_loss_reads_is_refused() -> None:
    with pytest.raises(ConfigError, match="teacher.path: got 'runs/arith-tiny/policy', but actor.policy_loss 'vanilla'"):
        load_config(overrides=[TEACHER])


def test_the_top_k_loss_needs_teacher_top_k() -> None:
    with pytest.raises(ConfigError, match="teacher.top_k: got 0"):
        load_config(overrides=["actor.policy_loss=forward_kl_topk", TEACHER])
    with pytest.raises(ConfigError, match="teacher.top_k: got 0"):
        load_config(overrides=["actor.policy_loss=distillation_ppo", "actor.distill_term=forward_kl_topk", TEACHER])
    config = load_config(overrides=["actor.policy_loss=forward_kl_topk", TEACHER, "teacher.top_k=8"])
    assert config.teacher.top_k == 8
    # reverse KL reads the sampled tokens' log-probs only
    assert load_config(overrides=["actor.policy_loss=reverse_kl", TEACHER]).teacher.top_k == 0


def test_teacher_fields_are_bounded() -> None:
    with pytest.raises(ConfigError, match="teacher.top_k"):
        load_config(overrides=["actor.policy_loss=forward_kl_topk", TEACHER, "teacher.top_k=100000"])
    with pytest.raises(ConfigError, match="teacher.temperature"):
        load_config(overrides=["actor.policy_loss=reverse_kl", TEACHER, "teacher.temperature=0"])
    with pytest.raises(ConfigError, match="teacher.bogus: unknown key"):
        load_config(overrides=["teacher.bogus=1"])


def test_separate_async_refuses_a_teacher_colocated_on_the_rollout_gpus() -> None:
    overrides = ["trainer.mode=separate_async", "actor.policy_loss=reverse_kl", TEACHER, "teacher.device=cuda"]
    with pytest.raises(ConfigError, match="teacher.placement: got 'colocate'"):
        load_config(overrides=[*overrides, "teacher.placement=colocate"])
    assert load_config(overrides=overrides).teacher.placement == "own_pool"


def test_the_step_runs_the_teacher_phase_only_with_a_teacher() -> None:
    assert not StepPlan.from_config(load_config()).teacher
    assert StepPlan.from_config(load_config(overrides=["actor.policy_loss=reverse_kl", TEACHER])).teacher


def test_the_pool_has_workers_only_with_a_teacher() -> None:
    with_teacher = load_config(overrides=["actor.policy_loss=reverse_kl", TEACHER, "teacher.num_workers=2"])
    assert num_teacher_workers(with_teacher.teacher.model_dump()) == 2
    assert with_teacher.num_actors == load_config().num_actors + 2
    assert num_teacher_workers(load_config().teacher.model_dump()) == 0
    assert TeacherPool().score("train", ["g/0", "g/1"]) == {}  # no teacher: nothing to do


def test_teacher_workers_are_placed_by_the_reward_pools_rules() -> None:
    base = ["actor.policy_loss=reverse_kl", TEACHER, "teacher.num_workers=2"]
    assert plan_placement(load_config(overrides=base)).teachers == [Slot(), Slot()]
    plan = plan_placement(load_config(overrides=[*base, "teacher.device=cuda"]))
    assert plan.groups["teachers"] == ([{"GPU": 1.0}] * 2, "PACK")
    assert plan.teachers == [Slot(1.0, "teachers", 0), Slot(1.0, "teachers", 1)]
    colocated = [
        *base, "actor.device=cuda", "rollout.device=cuda", "rollout.num_replicas=2",
        "teacher.device=cuda", "teacher.placement=colocate",
    ]  # fmt: skip
    plan = plan_placement(load_config(overrides=colocated))
    assert plan.teachers == [Slot(COLOCATED_REWARD_GPU, "colocated", 0), Slot(COLOCATED_REWARD_GPU, "colocated", 1)]
    assert all(slot.num_gpus == 0.5 - COLOCATED_REWARD_GPU for slot in plan.rollouts)
    with pytest.raises(ValueError, match="teacher.placement: 'colocate' on teacher.device 'cuda'"):
        plan_placement(load_config(overrides=[*base, "teacher.device=cuda", "teacher.placement=colocate"]))


def test_the_teachers_directory_is_checked_before_a_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = load_config(overrides=["actor.policy_loss=reverse_kl", f"teacher.path={tmp_path / 'missing'}"])
    with pytest.raises(FileNotFoundError, match="teacher.path .*missing does not exist: train the teacher first"):
        check_teacher_path(config.teacher)
    (tmp_path / "empty").mkdir()
    config.teacher.path = str(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        check_teacher_path(config.teacher)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    config.teacher.path = str(pickled)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        check_teacher_path(config.teacher)
    config.teacher.path = str(tiny_model_dir)
    check_teacher_path(config.teacher)
