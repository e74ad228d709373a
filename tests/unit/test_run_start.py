"""How a run starts on its run directory (R-9.3, R-9.5): fresh, resumed, overwritten or refused,
and the per-step files a resumed run continues from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_train.config import Config, config_to_yaml, load_config
from rl_train.flows.resume import LEDGER_FILE, checkpoint_store, open_run_files, plan_run_start
from rl_train.storage.metrics import METRICS_FILE, MetricsWriter, RunDirectoryExistsError, read_metrics


def _config(tmp_path: Path, *overrides: str) -> tuple[Config, str]:
    config = load_config(None, [f"run.output_dir={tmp_path}", "run.name=exp", *overrides])
    return config, f"{tmp_path}/exp"


def _previous_run(config: Config, run_dir: str, steps: int) -> None:
    writer = MetricsWriter(run_dir)
    for step in range(1, steps + 1):
        writer.write({"step": step, "reward/mean": step / 10})
    writer.write_text("config.yaml", config_to_yaml(config))


def _checkpoint(config: Config, run_dir: str, step: int) -> None:
    """A committed checkpoint holding the run files as they were at ``step``."""
    store = checkpoint_store(config, run_dir)
    rows = "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(1, step + 1))
    ledger = "".join(json.dumps({"step": s, "groups": [f"p{s}"]}) + "\n" for s in range(1, step + 1))
    parts = [
        store.write_bytes(step, f"run/{METRICS_FILE}", rows.encode()),
        store.write_bytes(step, f"run/{LEDGER_FILE}", ledger.encode()),
    ]
    store.commit(step, parts, {"step": step})


def test_an_empty_run_dir_starts_fresh(tmp_path: Path) -> None:
    config, run_dir = _config(tmp_path)
    assert plan_run_start(config, run_dir).kind == "fresh"


def test_a_run_killed_before_its_first_checkpoint_starts_over_without_duplicate_rows(tmp_path: Path) -> None:
    config, run_dir = _config(tmp_path)
    _previous_run(config, run_dir, steps=3)
    start = plan_run_start(config, run_dir)
    assert (start.kind, start.checkpoint_step) == ("resume", 0)
    files = open_run_files(config, run_dir, start, checkpoint_store(config, run_dir))
    assert files.history == [] and read_metrics(run_dir) == []


def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint_and_may_run_longer(tmp_path: Path) -> None:
    config, run_dir = _config(tmp_path)
    _previous_run(config, run_dir, steps=5)
    _checkpoint(config, run_dir, 4)
    longer, _ = _config(tmp_path, "trainer.total_steps=500")  # how long it runs may change
    start = plan_run_start(longer, run_dir)
    assert (start.kind, start.checkpoint_step) == ("resume", 4)
    files = open_run_files(longer, run_dir, start, checkpoint_store(longer, run_dir))
    assert [row["step"] for row in files.history] == [1, 2, 3, 4]
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3, 4]  # step 5 is redone
    files.metrics.write({"step": 5, "reward/mean": 0.9})
    files.ledger.write({"step": 5, "groups": ["p9"]})
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    ledger = [json.loads(line) for line in Path(run_dir, LEDGER_FILE).read_text().splitlines()]
    assert [row["step"] for row in ledger] == [1, 2, 3, 4, 5]


def test_other_settings_are_refused_naming_each_difference(tmp_path: Path) -> None:
    config, run_dir = _config(tmp_path)
    _previous_run(config, run_dir, steps=2)
    changed, _ = _config(tmp_path, "actor.lr=0.5", "rollout.n=4")
    with pytest.raises(RunDirectoryExistsError) as refused:
        plan_run_start(changed, run_dir)
    assert "actor.lr: 0.001 -> 0.5" in str(refused.value) and "rollout.n: 8 -> 4" in str(refused.value)
    assert len(read_metrics(run_dir)) == 2  # refusing changes nothing


def test_resume_off_refuses_and_overwrite_removes_the_earlier_checkpoints(tmp_path: Path) -> None:
    config, run_dir = _config(tmp_path)
    _previous_run(config, run_dir, steps=2)
    _checkpoint(config, run_dir, 2)
    off, _ = _config(tmp_path, "checkpoint.resume=false")
    with pytest.raises(RunDirectoryExistsError, match="checkpoint.resume is off"):
        plan_run_start(off, run_dir)
    over, _ = _config(tmp_path, "run.overwrite=true")
    start = plan_run_start(over, run_dir)
    assert start.kind == "overwrite"
    open_run_files(over, run_dir, start, checkpoint_store(over, run_dir))
    assert checkpoint_store(over, run_dir).complete_steps() == []
    assert not Path(run_dir, METRICS_FILE).exists()  # the earlier rows are gone; this run writes its own
