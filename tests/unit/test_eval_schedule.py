"""The eval deployment's schedule config, the deployment built from it, the serve and eval
command lines, and what an evaluation reads of a run (datasets, sampling, prompt encoding)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.client.schemas.objects import ConcurrencyLimitStrategy
from pydantic import ValidationError

from rl_train.cli import main
from rl_train.config import Config
from rl_train.deployments.eval_schedule import EVAL_DEPLOYMENT, EvalScheduleConfig, build_eval_deployment
from rl_train.engines.rollout.evaluation import PolicyEvaluator
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.flows.eval_target import EvalSettings, eval_datasets


def test_a_schedule_is_an_interval_or_a_cron_for_a_named_run() -> None:
    assert not EvalScheduleConfig().scheduled
    assert EvalScheduleConfig(run_dir="runs/a", interval_seconds=600).scheduled
    assert EvalScheduleConfig(run_dir="runs/a", cron="*/30 * * * *").scheduled
    with pytest.raises(ValidationError, match="not both"):
        EvalScheduleConfig(run_dir="runs/a", interval_seconds=600, cron="*/30 * * * *")
    with pytest.raises(ValidationError, match="needs run_dir"):
        EvalScheduleConfig(interval_seconds=600)
    with pytest.raises(ValidationError, match="every 5 minutes"):
        EvalScheduleConfig(run_dir="runs/a", cron="every 5 minutes")
    with pytest.raises(ValidationError, match="interval_seconds"):
        EvalScheduleConfig(run_dir="runs/a", interval_seconds=0)
    with pytest.raises(ValidationError, match="interval"):
        EvalScheduleConfig(run_dir="runs/a", interval=5)  # unknown keys fail


def test_the_deployment_carries_the_schedule_run_and_root() -> None:
    config = EvalScheduleConfig(run_dir="runs/a", interval_seconds=90, extra_val_files=["hard.parquet"])
    deployment = build_eval_deployment(config, "/srv/root")
    assert deployment.name == EVAL_DEPLOYMENT and deployment.flow_name == "rl-eval"
    (schedule,) = deployment.schedules
    assert schedule.schedule.interval == timedelta(seconds=90)
    assert deployment.parameters == {
        "run_dir": "runs/a",
        "extra_val_files": ["hard.parquet"],
        "root": "/srv/root",
    }
    assert deployment.concurrency_limit == 1
    assert deployment.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.CANCEL_NEW

    cron = build_eval_deployment(EvalScheduleConfig(run_dir="runs/a", cron="0 * * * *"), "/srv/root")
    assert cron.schedules[0].schedule.cron == "0 * * * *"
    on_demand = build_eval_deployment(EvalScheduleConfig(), "/srv/root")
    assert not on_demand.schedules and "run_dir" not in on_demand.parameters


def test_serve_refuses_a_schedule_without_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--eval-every", "60"]) == 2
    assert "needs run_dir" in capsys.readouterr().err


def test_eval_of_a_missing_run_names_the_file_it_looked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path / "nope"), "--no-prefect"]) == 2
    assert f"{tmp_path}/nope/config.yaml does not exist" in capsys.readouterr().err


def test_datasets_are_the_runs_validation_set_and_extra_files_by_stem(tmp_path: Path) -> None:
    config = Config.model_validate({"data": {"data_dir": "/data/sds"}})
    assert eval_datasets(config, [], "/root") == {"val": ["/data/sds/val.parquet"]}
    named = eval_datasets(config, ["more/hard.parquet", "/abs/easy.jsonl"], "/root")
    assert named == {
        "val": ["/data/sds/val.parquet"],
        "hard": ["/root/more/hard.parquet"],
        "easy": ["/abs/easy.jsonl"],
    }
    clashing = eval_datasets(config, ["a/x.parquet", "b/x.parquet", "c/val.parquet"], "/root")
    assert list(clashing) == ["val", "/root/a/x.parquet", "/root/b/x.parquet", "/root/c/val.parquet"]


def test_sampling_follows_the_runs_validation_unless_asked_otherwise() -> None:
    config = Config.model_validate({"rollout": {"max_new_tokens": 7, "val_temperature": 0.0}})
    assert EvalSettings.from_run(config, None, None, 1) == EvalSettings(
        temperature=0.0, max_new_tokens=7, n=1
    )
    assert EvalSettings.from_run(config, 3, 0.7, 4) == EvalSettings(temperature=0.7, max_new_tokens=3, n=4)
    with pytest.raises(ValueError, match="n >= 1"):
        EvalSettings.from_run(config, None, None, 0)


def test_prompts_are_encoded_as_a_rollout_replica_encodes_them(tmp_path: Path) -> None:
    from rl_train.engines.model.tiny import create_tiny_policy

    evaluator = PolicyEvaluator(
        create_tiny_policy(tmp_path / "policy", pretrain_steps=0)
    )  # only its tokenizer counts
    replica = SimpleNamespace(tokenizer=evaluator.engine.tokenizer)
    for text in ("3+4=", "", "a b\n"):
        assert evaluator.encode_prompt(text) == RolloutWorker.encode_prompt(replica, text)  # type: ignore[arg-type]
