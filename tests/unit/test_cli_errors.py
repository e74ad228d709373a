"""`rl-train train` checks the model path, the data and the run directory before any flow run
starts: a user's first mistakes get one line and exit code 2, never a traceback."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rl_train.cli import main
from rl_train.config import config_to_yaml, load_config
from rl_train.storage.dataset import COLUMNS_DOC
from rl_train.storage.metrics import MetricsWriter, read_metrics

GOOD = {"prompt": "1+1=", "data_source": "arith/sum", "ground_truth": "2"}


class FlowSpy:
    """Stands in for ``rl_train.flows.train``: records whether a run was started."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.warm_starts: list[bool] = []
        """``use_prefect`` of each ``warm_start`` (Ray, Prefect's API, imports), which comes first."""

    def warm_start(
        self, ray_address: str | None, ray_num_cpus: int | None, use_prefect: bool, num_actors: int = 0, after_ray: Any = None
    ) -> None:
        assert not self.calls, "the warm start comes before the run"
        self.warm_starts.append(use_prefect)  # after_ray (asking Ray for the actors) is not run: no Ray here

    def run_training(self, config: Any, run_id: str | None = None) -> dict[str, Any]:
        self.calls.append("run_training")
        return {"steps": 0}

    def train_flow(self, **params: Any) -> dict[str, Any]:
        self.calls.append("train_flow")
        return {"steps": 0}


@pytest.fixture
def flow_spy(monkeypatch: pytest.MonkeyPatch) -> FlowSpy:
    spy = FlowSpy()
    module = types.ModuleType("rl_train.flows.train")
    module.run_training = spy.run_training  # type: ignore[attr-defined]
    module.train_flow = spy.train_flow  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rl_train.flows.train", module)
    startup = types.ModuleType("rl_train.flows.startup")
    startup.warm_start = spy.warm_start  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rl_train.flows.startup", startup)
    return spy


def _config(tmp_path: Path, train: Path, val: Path | None = None, **run: Any) -> Path:
    config = {
        "run": {"name": "exp", "output_dir": str(tmp_path / "runs"), **run},
        "model": {"path": str(tmp_path / "model")},
        "data": {"builtin_task": None, "train_files": [str(train)], "val_files": [str(val or train)]},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train(config: Path, *extra: str) -> int:
    return main(["train", "--config", str(config), *extra])


def test_a_bad_jsonl_row_is_one_line_and_no_flow_starts(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [GOOD, {"prompt": "2+2=", "data_source": "arith/sum"}])
    assert _train(_config(tmp_path, train)) == 2
    err = capsys.readouterr().err
    assert err == f"rl-train: bad dataset: {train}:row 2: column 'ground_truth' is missing\n"
    assert flow_spy.calls == []


@pytest.mark.parametrize("no_prefect", [True, False])
def test_a_bad_parquet_row_stops_both_paths_before_a_flow(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str], no_prefect: bool
) -> None:
    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD, GOOD, {**GOOD, "prompt": ""}]), train)
    assert _train(_config(tmp_path, train), *(["--no-prefect"] if no_prefect else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rl-train: bad dataset: {train}:row 3: column 'prompt' must be a non-empty string")
    assert "Traceback" not in err
    assert flow_spy.calls == [] and flow_spy.warm_starts == []  # nor Ray, nor Prefect's API


def test_a_bad_val_row_is_caught_when_validation_runs(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps(GOOD) + "\n\n" + '{"prompt": "3+3=",\n')  # line 3 is broken JSON
    assert _train(_config(tmp_path, train, val)) == 2
    assert f"{val}:row 3: not valid JSON" in capsys.readouterr().err
    assert flow_spy.calls == []
    # with validation off, the val file is not read and the run starts
    assert (
        _train(_config(tmp_path, train, val), "trainer.val_before_train=false", "trainer.val_every_steps=0")
        == 0
    )
    assert flow_spy.calls == ["train_flow"]


def test_a_data_source_no_reward_takes_is_a_bad_row(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [GOOD, {**GOOD, "data_source": "code/python"}])
    assert _train(_config(tmp_path, train)) == 2
    err = capsys.readouterr().err
    assert f"{train}:row 2: column 'data_source': no reward for data_source 'code/python'" in err
    assert "reward.by_data_source" in err and "reward.default" in err  # the fix is named
    assert flow_spy.calls == []


def test_a_missing_model_that_may_not_be_created_is_reported_before_a_flow(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    assert _train(_config(tmp_path, train), "model.create_if_missing=false") == 2
    assert "model.create_if_missing is off" in capsys.readouterr().err
    assert flow_spy.calls == []


def test_a_reused_run_name_with_other_settings_is_refused_unless_overwrite(
    tmp_path: Path, flow_spy: FlowSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    run_dir = str(tmp_path / "runs" / "exp")
    MetricsWriter(run_dir).write({"step": 1, "reward/mean": 0.5})
    earlier = load_config(_config(tmp_path, train), ["actor.lr=0.5"])
    Path(run_dir, "config.yaml").write_text(config_to_yaml(earlier))
    assert _train(_config(tmp_path, train)) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings" in err and "actor.lr: 0.5 -> 0.001" in err
    assert "run.overwrite=true" in err
    assert flow_spy.calls == [] and read_metrics(run_dir) == [{"step": 1, "reward/mean": 0.5}]
    # with checkpoint.resume off, any earlier run is refused, same settings or not
    Path(run_dir, "config.yaml").write_text(config_to_yaml(load_config(_config(tmp_path, train), [])))
    assert _train(_config(tmp_path, train), "checkpoint.resume=false") == 2
    assert "checkpoint.resume is off" in capsys.readouterr().err
    assert flow_spy.calls == []
    assert _train(_config(tmp_path, train, overwrite=True), "--no-prefect") == 0
    assert flow_spy.calls == ["run_training"]  # the trainer, once started, clears the earlier run


def test_built_in_data_is_written_and_checked_before_the_flow(tmp_path: Path, flow_spy: FlowSpy) -> None:
    data_dir = tmp_path / "data"
    overrides = [
        f"run.output_dir={tmp_path / 'runs'}",
        f"model.path={tmp_path / 'model'}",
        f"data.data_dir={data_dir}",
    ]
    assert main(["train", "--no-prefect", *overrides]) == 0
    assert (data_dir / "train.parquet").exists() and (data_dir / "val.parquet").exists()
    assert flow_spy.calls == ["run_training"]
    assert flow_spy.warm_starts == [False]  # Ray and the imports, no Prefect API for a run without it


def test_config_docs_describe_the_dataset_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--docs"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(COLUMNS_DOC)
    for column in ("prompt", "data_source", "ground_truth"):
        assert f"  {column}" in COLUMNS_DOC
