"""The run config: dotted-path errors, overrides, registered names, docs on every field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.config import Config, ConfigError, describe_fields, load_config
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import lr_lambda
from rl_train.flows.registry import get_trainer_class
from rl_train.modes import MODES
from rl_train.registry import UnknownNameError

REPO = Path(__file__).resolve().parents[2]


def test_demo_config_loads_and_overrides_apply() -> None:
    cfg = load_config(
        REPO / "configs" / "arith-tiny.yaml", ["trainer.total_steps=50", "actor.lr=3e-4", "run.name=x"]
    )
    assert cfg.trainer.total_steps == 50
    assert cfg.actor.lr == pytest.approx(3e-4)
    assert cfg.run.name == "x"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.total_steps=abc", "trainer.total_steps: got 'abc'"),
        ("rollout.n=0", "rollout.n: got 0"),
        ("actor.lr_schedule=zigzag", "actor.lr_schedule: got 'zigzag'"),
        ("actor.nonsense=1", "actor.nonsense: unknown key"),
        (
            "trainer.mode=turbo",
            "trainer.mode: got 'turbo': unknown name; available: colocate_async, separate_async, sync",
        ),
        ("algorithm.adv_estimator=nope", "algorithm.adv_estimator"),
        ("rollout.weight_sync.backend=pigeon", "rollout.weight_sync.backend"),
    ],
)
def test_errors_name_the_dotted_path_and_value(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert expected in str(info.value)


def test_unknown_key_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"allowed keys here: .*total_steps"):
        load_config(None, ["trainer.total_stepz=3"])


def test_contradictions_fail_before_anything_starts() -> None:
    with pytest.raises(
        ConfigError,
        match=r"trainer.train_batch_size \(10\) must be divisible by trainer.parameter_sync_step \(4\)",
    ):
        load_config(None, ["trainer.train_batch_size=10", "trainer.parameter_sync_step=4"])
    with pytest.raises(ConfigError, match="actor.kl_loss_coef"):
        load_config(None, ["actor.kl_loss=true"])


def test_bad_files_and_overrides(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="dotted.path=value"):
        load_config(None, ["trainer.total_steps"])


def test_every_field_has_a_docstring() -> None:
    missing = [path for path, _, doc in describe_fields() if not doc]
    assert not missing, f"fields without a docstring: {missing}"


def test_lr_horizon_counts_local_updates() -> None:
    cfg = Config.model_validate(
        {"trainer": {"total_steps": 10, "parameter_sync_step": 4, "train_batch_size": 8}}
    )
    assert cfg.optimizer_horizon_steps == 40


def test_the_lr_decay_ends_at_its_ratio_of_the_horizon_and_stays_at_the_floor() -> None:
    cfg = ActorConfig(lr_schedule="cosine", lr_warmup_steps=2, min_lr_ratio=0.1, lr_decay_ratio=0.5)
    factor = lr_lambda(cfg, horizon_steps=20)  # warm-up over steps 0-1, decay over 2..10, then the floor
    assert [factor(0), factor(1)] == [0.5, 1.0]
    assert factor(2) == pytest.approx(1.0)
    assert factor(6) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert [factor(10), factor(15), factor(19)] == pytest.approx([0.1, 0.1, 0.1])
    whole = lr_lambda(cfg.model_copy(update={"lr_decay_ratio": 1.0}), horizon_steps=20)
    assert whole(11) == pytest.approx(0.1 + 0.9 * 0.5)  # the default: the decay spans the horizon
    with pytest.raises(ValueError, match="lr_decay_ratio"):
        ActorConfig(lr_decay_ratio=0.0)


def test_num_actors_counts_every_pool_the_run_creates() -> None:
    """What a local Ray is told to start at once (ray_start.ensure_ray): the queue, 1 training
    rank, 1 replica and 1 reward worker by default; the critic's ranks only when it is on."""
    assert load_config(None, []).num_actors == 4
    cfg = load_config(None, ["actor.num_ranks=2", "rollout.num_replicas=3", "reward.num_workers=2"])
    assert cfg.num_actors == 1 + 2 + 3 + 2
    gae = load_config(None, ["algorithm.adv_estimator=gae", "critic.num_ranks=2"])
    assert gae.critic.enable and gae.num_actors == 4 + 2


def test_an_unknown_trainer_mode_lists_the_modes() -> None:
    expected = "unknown trainer mode 'turbo'; available: colocate_async, separate_async, sync"
    with pytest.raises(UnknownNameError, match=expected):
        get_trainer_class("turbo")


def test_every_mode_names_a_trainer_class_defined_in_its_own_module() -> None:
    """The modes' table (rl_train.modes) names each trainer class by import path: a run imports
    exactly that class, from the module start-up imports early (``flows.startup``)."""
    from rl_train.flows.base import BaseTrainer

    for name in MODES:
        trainer = get_trainer_class(name)
        assert issubclass(trainer, BaseTrainer) and trainer.__module__ == MODES[name].module, name
