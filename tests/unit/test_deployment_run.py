"""A deployment run's paths resolve under the recorded root and it gets a run name of its own."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prefect.server.events.schemas.automations import EventTrigger as ServerEventTrigger
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from rl_train.config import load_config
from rl_train.deployments.crash_detection import (
    HEARTBEAT_SECONDS,
    SILENCE_ENV,
    SILENCE_SECONDS,
    crash_automation,
    heartbeat_seconds,
    silence_seconds,
)
from rl_train.deployments.serve import EPHEMERAL_NOTICE, deployment_parameters, prepare_server
from rl_train.flows.base import prepare_inputs
from rl_train.flows.deployment_run import (
    ROOT_ENV,
    deployment_config,
    resolve_paths,
    serve_root,
    under_root,
)

RUN_ID = "1a2b3c4d-0000-4000-8000-000000000000"


def test_relative_paths_join_the_root_and_others_are_kept() -> None:
    assert under_root("runs", "/srv/rl") == "/srv/rl/runs"
    assert under_root("./data/../data/x.parquet", "/srv/rl") == "/srv/rl/data/x.parquet"
    assert under_root("/abs/model", "/srv/rl") == "/abs/model"
    assert under_root("s3://bucket/runs", "/srv/rl") == "s3://bucket/runs"


def test_every_path_field_is_made_absolute() -> None:
    config = load_config(
        None,
        [
            "model.path=models/p",
            "data.data_dir=data/d",
            "data.train_files=[a.parquet, /abs/b.parquet]",
            "data.val_files=[v.jsonl]",
            "run.output_dir=s3://bucket/runs",
        ],
    )
    resolved = resolve_paths(config, "/srv/rl")
    assert resolved.model.path == "/srv/rl/models/p"
    assert resolved.data.data_dir == "/srv/rl/data/d"
    assert resolved.data.train_files == ["/srv/rl/a.parquet", "/abs/b.parquet"]
    assert resolved.data.val_files == ["/srv/rl/v.jsonl"]
    assert resolved.run.output_dir == "s3://bucket/runs"
    assert config.model.path == "models/p"  # the caller's config is untouched


def test_a_missing_model_names_the_absolute_path_it_tried(tmp_path: Path) -> None:
    config = deployment_config(
        load_config(None, ["model.path=models/absent", "model.create_if_missing=false"]),
        str(tmp_path),
        "brave-otter",
        RUN_ID,
    )
    with pytest.raises(FileNotFoundError, match=f"model.path {tmp_path}/models/absent does not exist"):
        prepare_inputs(config)


def test_a_run_without_a_name_gets_one_per_flow_run() -> None:
    config = load_config(None, ["trainer.mode=colocate_async"])
    first = deployment_config(config, "/srv/rl", "brave-otter", RUN_ID)
    assert first.run.name == "colocate_async-brave-otter-1a2b3c4d"
    # A retry is the same flow run: same name, same directory (which it then resumes).
    assert deployment_config(config, "/srv/rl", "brave-otter", RUN_ID).run.name == first.run.name
    other = deployment_config(config, "/srv/rl", "brave-otter", str(uuid.uuid4()))
    assert other.run.name != first.run.name  # equal flow run names still get their own directory
    assert first.run.output_dir == "/srv/rl/runs"


def test_a_run_that_names_itself_keeps_its_name() -> None:
    for config in (
        load_config(None, ["run.name=mine"]),
        load_config(None, ["run.name=arith-tiny"]),  # the default's value, but set on purpose
    ):
        assert deployment_config(config, "/srv/rl", "brave-otter", RUN_ID).run.name == config.run.name


def test_the_root_is_recorded_when_serve_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert serve_root() == str(tmp_path)
    assert deployment_parameters("sync")["root"] == str(tmp_path)
    monkeypatch.setenv(ROOT_ENV, "relative/root")
    assert serve_root() == os.path.join(str(tmp_path), "relative/root")


def test_serve_without_a_server_says_it_is_throwaway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with temporary_settings({PREFECT_API_URL: None}):
        prepare_server(str(tmp_path))
    err = capsys.readouterr().err
    assert EPHEMERAL_NOTICE in err
    assert "prefect server start" in err and "export PREFECT_API_URL=http://127.0.0.1:4200/api" in err
    assert str(tmp_path) in err


def _event(name: str, flow: str, deployment: bool, tags: tuple[str, ...] = ()) -> ReceivedEvent:
    """A flow-run event as the server receives it: related to its flow, its deployment (a
    deployment run) and its tags, as Prefect's heartbeats and state events are."""
    related = [{"prefect.resource.id": f"prefect.flow.{uuid.uuid4()}", "prefect.resource.role": "flow",
                "prefect.resource.name": flow}]
    if deployment:
        related.append({"prefect.resource.id": f"prefect.deployment.{uuid.uuid4()}",
                        "prefect.resource.role": "deployment", "prefect.resource.name": "sync"})
    related += [{"prefect.resource.id": f"prefect.tag.{t}", "prefect.resource.role": "tag"} for t in tags]
    return ReceivedEvent(
        occurred=datetime.now(timezone.utc),
        event=name,
        resource={"prefect.resource.id": f"prefect.flow-run.{RUN_ID}", "prefect.resource.name": "brave-otter"},
        related=related,
        id=uuid.uuid4(),
    )


def test_crash_automation_watches_the_heartbeats_of_served_rl_train_runs_only() -> None:
    automation = crash_automation()
    trigger = ServerEventTrigger.model_validate(automation.trigger.model_dump())  # as the server reads it
    assert trigger.posture == "Proactive" and trigger.starts_after("prefect.flow-run.heartbeat")
    assert trigger.within.total_seconds() == SILENCE_SECONDS and trigger.for_each == {"prefect.resource.id"}
    served = ("rl-train", True, ("rl-train", "sync"))
    assert trigger.covers(_event("prefect.flow-run.heartbeat", *served))
    for state in ("Completed", "Failed", "Cancelled", "Crashed"):  # a final state ends the wait
        assert trigger.covers(_event(f"prefect.flow-run.{state}", *served)) and trigger.expects(
            f"prefect.flow-run.{state}"
        )
    assert not trigger.expects("prefect.flow-run.Running")
    # `rl-train train` against the same server: no deployment, Prefect's 180 s heartbeat; and
    # other flows' runs: never watched.
    assert not trigger.covers(_event("prefect.flow-run.heartbeat", "rl-train", False))
    assert not trigger.covers(_event("prefect.flow-run.heartbeat", "global-step", True, ("rl-train",)))
    assert not trigger.covers(_event("prefect.flow-run.heartbeat", "rl-eval", True))
    action = automation.actions[0]
    assert action.type == "change-flow-run-state" and action.state == "CRASHED"


def test_served_runs_beat_every_30_s_unless_the_user_says_otherwise() -> None:
    assert "PREFECT_FLOWS_HEARTBEAT_FREQUENCY" not in os.environ  # the test process's settings
    assert heartbeat_seconds() == HEARTBEAT_SECONDS == 30  # not Prefect's default of 180 s
    for user_value in (45, 180):  # the user's value wins, even when it equals Prefect's default
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: user_value}):
            assert heartbeat_seconds() == user_value


def test_the_silence_must_outlast_a_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SILENCE_ENV, raising=False)
    assert silence_seconds() == SILENCE_SECONDS
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}):
        assert silence_seconds() == 150  # a user's longer period: two and a half of theirs
    monkeypatch.setenv(SILENCE_ENV, "40")
    assert silence_seconds() == 40.0
    for bad in ("30", "abc"):
        monkeypatch.setenv(SILENCE_ENV, bad)
        with pytest.raises(ValueError, match=SILENCE_ENV):
            silence_seconds()
