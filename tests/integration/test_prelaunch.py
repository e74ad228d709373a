"""Actors asked for before the flow begins (flows/prelaunch.py): the trainer of the same config
takes them over, and actors no trainer takes over are killed, whatever stopped the run."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.workers.pools import WorkerClasses, run_namespace
from rl_train.flows import prelaunch
from rl_train.flows.sync import SyncTrainer

pytestmark = pytest.mark.integration

GONE_SECONDS = 15.0


def _config(small_run_config: dict[str, Any], **run: Any) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(total_steps=1, train_batch_size=2, use_prefect=False, val_every_steps=0)
    cfg["rollout"].update(n=2, max_new_tokens=4)
    cfg["run"].update(run)
    apply_mode_defaults(cfg)
    return Config.model_validate(cfg)


def _run_actors(run_id: str) -> list[str]:
    namespace = run_namespace(run_id)
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def _gone(run_id: str) -> list[str]:
    """The run's actors still alive after waiting up to ``GONE_SECONDS`` for them to go."""
    deadline = time.monotonic() + GONE_SECONDS
    while (left := _run_actors(run_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_the_trainer_of_the_same_config_takes_the_actors_over(small_run_config: dict[str, Any], ray_local) -> None:
    config = _config(small_run_config)
    run_id = prelaunch.prelaunch(config, WorkerClasses())
    assert run_id is not None and run_id.startswith("it-")
    assert "transfer-queue" in _run_actors(run_id)  # asked for before any trainer exists
    trainer = SyncTrainer(Config.model_validate(config.model_dump(mode="json")))  # as the flow rebuilds it
    assert trainer.run_id == run_id
    assert len(trainer.fit()) == 1
    prelaunch.abandon()  # what the command does at its end: nothing left to kill, nothing raised
    assert _gone(run_id) == []  # the trainer shut its pools down


def test_actors_of_another_config_are_killed_and_the_trainer_makes_its_own(
    small_run_config: dict[str, Any], ray_local
) -> None:
    run_id = prelaunch.prelaunch(_config(small_run_config), WorkerClasses())
    assert run_id is not None
    other = SyncTrainer(_config(small_run_config, name="other"))
    assert other.run_id != run_id and other.run_id.startswith("other-")
    assert _gone(run_id) == []
    assert prelaunch.adopt(_config(small_run_config)) is None  # taken once, even when refused


def test_actors_are_killed_when_the_run_stops_before_its_trainer_begins(
    small_run_config: dict[str, Any], ray_local
) -> None:
    run_id = prelaunch.prelaunch(_config(small_run_config), WorkerClasses())
    assert run_id is not None
    prelaunch.abandon()  # the command ends (its flow failed before building the trainer)
    assert _gone(run_id) == []


def test_a_trainer_that_fails_before_its_actors_are_ready_kills_them(
    small_run_config: dict[str, Any], ray_local, tmp_path: Path
) -> None:
    config = _config(small_run_config)
    run_id = prelaunch.prelaunch(config, WorkerClasses())
    trainer = SyncTrainer(config)
    assert trainer.run_id == run_id
    for path in config.data.resolved_train_files():
        Path(path).unlink()  # gone between the command's checks and the trainer's
    with pytest.raises(Exception, match=r"train|No such file|not exist"):
        trainer.fit()
    assert _gone(run_id) == []


def test_nothing_is_launched_for_a_policy_that_does_not_exist_yet(
    small_run_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = copy.deepcopy(small_run_config)
    cfg["model"] = {"path": str(tmp_path / "made-by-the-trainer"), "create_if_missing": True}
    config = _config(cfg)
    assert prelaunch.prelaunch(config, WorkerClasses()) is None  # no Ray needed: nothing asked
    assert prelaunch.adopt(config) is None


def test_the_command_goes_on_when_asking_early_fails(
    small_run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking before the flow is best effort: the trainer asks again inside its flow run, where
    the error is the run's failure (and shows in Prefect's UI)."""
    from rl_train import cli

    def refuse(config: Config, classes: WorkerClasses) -> str:
        raise RuntimeError("no placement for these actors")

    monkeypatch.setattr(prelaunch, "prelaunch", refuse)
    cli._prelaunch(_config(small_run_config))  # returns: nothing raised, nothing launched
    assert prelaunch.adopt(_config(small_run_config)) is None
