"""``rl-eval`` on a real run: a tiny sync run of 2 steps with a checkpoint after each, trained
once for this module; every test evaluates a copy of its run directory.

- the newest checkpoint scores what the run's own validation scored at that step, and what
  ``transformers``' greedy answers of the same policy score; results and history are written,
  a re-run skips, a new dataset is added, ``force`` re-evaluates;
- a run without a complete checkpoint fails naming the run and the checkpoint root;
- a torn newer folder is skipped and left as it was, and committed afterwards; a damaged
  newest checkpoint falls back to the previous one; an evaluation runs while a writer
  commits and prunes checkpoints of the same run, and neither gets in the other's way;
- checkpoints and results on S3;
- served with a 3 s interval against a real Prefect server, a scheduled run evaluates the
  newest checkpoint and publishes its table and reward curve, read back through the API.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import fsspec
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from serve_fixture import kill_marked, wait_for

from rl_train.config import Config
from rl_train.deployments.eval_schedule import EVAL_DEPLOYMENT
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.router import RewardRouter
from rl_train.flows.eval_target import NoCheckpointError
from rl_train.flows.evaluate import evaluate_run
from rl_train.flows.train import run_training
from rl_train.flows.ui import artifact_key
from rl_train.storage.builtin_data import write_builtin_task
from rl_train.storage.checkpoint import CheckpointCorruptError, CheckpointStore, step_dir_name
from rl_train.storage.checkpoint_manifest import manifest_parts
from rl_train.storage.dataset import load_prompts
from rl_train.storage.eval_results import EvalResults
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, ray_local: Any) -> Path:
    """The integration runs' small config (tests/integration/conftest.py), 2 steps, validated
    and checkpointed after each."""
    root = tmp_path_factory.mktemp("eval-run")
    write_builtin_task("single_digit_sum", root / "data")
    config = Config.model_validate(
        {
            "run": {"name": "it", "output_dir": str(root / "runs")},
            "model": {"path": str(tiny_model_dir), "create_if_missing": False},
            "data": {"builtin_task": None, "data_dir": str(root / "data")},
            "trainer": {
                "total_steps": 2,
                "train_batch_size": 8,
                "val_every_steps": 1,
                "val_before_train": False,
                "use_prefect": False,
            },
            "rollout": {"n": 4, "max_new_tokens": 4, "num_threads": 1},
            "actor": {"num_threads": 1},
            "checkpoint": {"every_steps": 1},
        }
    )
    return Path(run_training(config)["run_dir"])


@pytest.fixture
def run_dir(trained_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs" / trained_run.name
    shutil.copytree(trained_run, copy)
    return copy


def _val_prompts(run_dir: Path) -> list[dict[str, Any]]:
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return load_prompts([Path(config["data"]["data_dir"]) / "val.parquet"])


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_newest_checkpoint_scores_as_the_run_validated_and_reruns_skip(run_dir: Path, tmp_path: Path) -> None:
    outcome = evaluate_run(str(run_dir))
    assert (outcome.step, outcome.evaluated) == (2, ["val"])
    eval_dir = run_dir / "checkpoints" / "eval"
    document = json.loads((eval_dir / "step-00000002.json").read_text())
    assert document["checkpoint"] == f"{run_dir}/checkpoints/step-00000002" and document["step"] == 2
    val = document["datasets"]["val"]
    assert val["count"] == val["num_prompts"] == len(_val_prompts(run_dir))
    assert val["settings"] == {"temperature": 0.0, "max_new_tokens": 4, "n": 1, "top_p": 1.0}
    assert len(val["samples"]) == 4 and {"prompt", "response", "ground_truth", "reward"} <= set(
        val["samples"][0]
    )
    # The run validated step 2 after its weight sync, then saved checkpoint 2: the same policy,
    # greedy on the same prompts, through Ray workers there and in this process here.
    (row,) = [m for m in read_metrics(str(run_dir)) if m["step"] == 2]
    assert val["reward_mean"] == pytest.approx(row["val/reward_mean"], abs=1e-12)
    history = [json.loads(line) for line in (eval_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["step"], h["dataset"], h["reward"], h["count"]) for h in history] == [
        (2, "val", val["reward_mean"], val["count"])
    ]

    written = _tree(eval_dir)
    again = evaluate_run(str(run_dir))
    assert (again.step, again.evaluated, again.summary()["skipped"]) == (2, [], True)
    assert _tree(eval_dir) == written  # an idempotent schedule tick writes nothing

    extra = tmp_path / "sums.jsonl"
    rows = [
        {"prompt": p["prompt"], "data_source": p["data_source"], "ground_truth": p["ground_truth"]}
        for p in _val_prompts(run_dir)[:3]
    ]
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    added = evaluate_run(str(run_dir), extra_val_files=[str(extra)])
    assert added.evaluated == ["sums"]  # the validation set at step 2 is not scored again
    document = json.loads((eval_dir / "step-00000002.json").read_text())
    assert document["datasets"]["val"] == val and document["datasets"]["sums"]["count"] == 3

    forced = evaluate_run(str(run_dir), extra_val_files=[str(extra)], force=True)
    assert forced.evaluated == ["val", "sums"]
    history = EvalResults(str(run_dir / "checkpoints")).history()
    assert [(h["step"], h["dataset"]) for h in history] == [(2, "val"), (2, "sums"), (2, "val"), (2, "sums")]
    assert history[2]["reward"] == val["reward_mean"]  # greedy: the same answers again


def test_reward_is_the_score_of_the_policys_greedy_answers(run_dir: Path, tmp_path: Path) -> None:
    """``transformers``' own greedy decoding of the checkpoint's policy, one prompt at a time
    (no padding), each answer cut at EOS and scored by its data_source's reward function."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    val = evaluate_run(str(run_dir), step=1).document["datasets"]["val"]
    policy = CheckpointStore(str(run_dir / "checkpoints")).download_dir(1, "policy", tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(policy, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy, local_files_only=True)
    answers, rewards = [], []
    for row in _val_prompts(run_dir):
        ids = torch.tensor(
            [[tokenizer.bos_token_id, *tokenizer.encode(row["prompt"], add_special_tokens=False)]]
        )
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=4,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )[0, ids.shape[1] :].tolist()
        if tokenizer.eos_token_id in out:
            out = out[: out.index(tokenizer.eos_token_id)]
        answers.append(tokenizer.decode(out, skip_special_tokens=True))
        rewards.append(RewardRouter().score([Trajectory.of_answer(row, answers[-1])])[0].score)
    assert val["reward_mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-12)
    assert [s["response"] for s in val["samples"]] == answers[: len(val["samples"])]
    assert [s["reward"] for s in val["samples"]] == rewards[: len(val["samples"])]


def test_a_run_without_a_complete_checkpoint_names_the_run_and_the_root(run_dir: Path) -> None:
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "step-00000001")
    (checkpoints / "step-00000002" / "manifest.json").unlink()  # a write that never finished
    with pytest.raises(NoCheckpointError) as error:
        evaluate_run(str(run_dir))
    message = str(error.value)
    assert f"the run {run_dir} has no complete checkpoint" in message
    assert f"checkpoint root {checkpoints}" in message
    assert not (checkpoints / "eval").exists()


def test_a_torn_newer_folder_is_skipped_untouched_and_commits_afterwards(run_dir: Path) -> None:
    store = CheckpointStore(str(run_dir / "checkpoints"))
    parts = [
        store.write_bytes(3, path, store.read_bytes(2, path)) for path in manifest_parts(store.manifest(2))
    ]
    before = {p: h for p, h in _tree(run_dir / "checkpoints").items() if not p.startswith("eval/")}

    assert evaluate_run(str(run_dir)).step == 2  # step 3 is being written: no manifest yet
    after = _tree(run_dir / "checkpoints")
    assert {p: h for p, h in after.items() if not p.startswith("eval/")} == before
    assert sorted(p for p in after if p.startswith("eval/")) == [
        "eval/history.jsonl",
        "eval/step-00000002.json",
    ]

    store.commit(3, parts, {"step": 3})  # the writer finishes as if no evaluation had happened
    assert store.verify(3) == [] and store.complete_steps() == [1, 2, 3]
    assert evaluate_run(str(run_dir)).step == 3


def test_a_damaged_newest_checkpoint_falls_back_unless_its_step_is_asked_for(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = run_dir / "checkpoints" / "step-00000002" / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the checksum can tell
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="rl_train.flows.evaluate"):
        assert evaluate_run(str(run_dir)).step == 1
    assert "step-00000002" in caplog.text and "policy/model.safetensors" in caplog.text
    with pytest.raises(CheckpointCorruptError, match="step-00000002/policy/model.safetensors"):
        evaluate_run(str(run_dir), step=2)
    assert EvalResults(str(run_dir / "checkpoints")).read_step(2) is None


def test_a_traversing_manifest_key_is_refused_and_nothing_is_written_outside(
    run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding: a manifest entry ``policy/../../../../payload.txt`` made the evaluation's copy
    of the policy write outside its temporary folder. Now the hostile checkpoint is skipped with
    a warning naming its key (or refused, when its step is asked for) and nothing is written."""
    scratch = tmp_path / "scratch" / "a" / "b"
    scratch.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the evaluation's temporary folder
    manifest = run_dir / "checkpoints" / "step-00000002" / "manifest.json"
    document = json.loads(manifest.read_text())
    weights = document["files"]["policy/model.safetensors"]
    document["files"]["policy/../../../../payload.txt"] = weights
    manifest.write_text(json.dumps(document))
    before = {str(p) for p in tmp_path.rglob("*")}
    with caplog.at_level(logging.WARNING, logger="rl_train.flows.evaluate"):
        assert evaluate_run(str(run_dir)).step == 1
    assert "step-00000002" in caplog.text and "policy/../../../../payload.txt" in caplog.text
    with pytest.raises(CheckpointCorruptError, match=r"step-00000002/manifest.json: bad manifest key .*'\.\.'"):
        evaluate_run(str(run_dir), step=2)
    written = {str(p) for p in tmp_path.rglob("*")} - before
    assert not [path for path in written if "payload" in path]
    assert not list(scratch.iterdir())  # the temporary folders are gone, nothing left beside them
    assert EvalResults(str(run_dir / "checkpoints")).read_step(2) is None


def test_an_evaluation_and_a_writer_committing_and_pruning_do_not_meet(run_dir: Path) -> None:
    """A writer commits checkpoint after checkpoint, keeping only the newest 2, while an
    evaluation runs: the checkpoint being read may be pruned under it (it then takes the newest
    other one). Every commit succeeds and verifies; the evaluation ends with the step it read."""
    writer = CheckpointStore(str(run_dir / "checkpoints"), keep_last=2)
    payload = {path: writer.read_bytes(2, path) for path in manifest_parts(writer.manifest(2))}
    outcome: list[Any] = []
    evaluation = threading.Thread(target=lambda: outcome.append(evaluate_run(str(run_dir))))
    evaluation.start()
    committed = []
    step = 3
    while evaluation.is_alive() and step < 300:
        writer.commit(step, [writer.write_bytes(step, p, b) for p, b in payload.items()], {"step": step})
        committed.append(step)
        step += 1
        evaluation.join(0.01)
    evaluation.join()
    assert outcome, "the evaluation failed (see the thread's exception above)"
    assert committed and writer.latest_valid() == committed[-1]
    assert writer.complete_steps() == sorted({1, 2, *committed})[-2:]
    result = outcome[0]
    assert result.evaluated == ["val"] and 2 <= result.step <= committed[-1]
    assert EvalResults(str(run_dir / "checkpoints")).read_step(result.step)["step"] == result.step
    assert not [
        p for p in (run_dir / "checkpoints").rglob("*") if p.name.startswith(".")
    ]  # no temporary file left


def test_checkpoints_and_results_on_s3(
    run_dir: Path, s3_root: tuple[str, dict[str, Any]], s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, options = s3_root
    fs = fsspec.filesystem("s3", **options)
    local = run_dir / "checkpoints" / step_dir_name(2)
    for path in local.rglob("*"):
        if path.is_file():
            fs.pipe(f"{root}/{step_dir_name(2)}/{path.relative_to(local)}", path.read_bytes())
    shutil.rmtree(run_dir / "checkpoints")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["checkpoint"]["dir"] = root
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # how the run's own store finds the server

    outcome = evaluate_run(str(run_dir))
    assert outcome.step == 2 and outcome.summary()["results"] == f"{root}/eval/step-00000002.json"
    results = EvalResults(root, options)
    assert results.read_step(2)["datasets"]["val"]["count"] == len(_val_prompts(run_dir))
    assert [h["step"] for h in results.history()] == [2]
    assert not (run_dir / "checkpoints").exists()


# -- the scheduled deployment, against a real local Prefect server ------------------------------

BIN = Path(sys.executable).parent
MARKER = "RL_TRAIN_TEST_EVAL_SERVE_MARKER"
"""Set in serve's environment and so inherited by every flow-run process it starts: the test
ends exactly those, by id."""


@pytest.mark.slow
def test_a_scheduled_run_evaluates_the_newest_checkpoint_and_publishes_it(
    prefect_server: dict[str, str], run_dir: Path, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex
    env = {**prefect_server, MARKER: marker, "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    log = tmp_path / "serve.log"
    serve = subprocess.Popen(
        [str(BIN / "rl-train"), "serve", "--eval-run-dir", str(run_dir), "--eval-every", "3"],
        env=env,
        cwd=tmp_path,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    started = time.time()
    try:
        with get_client(sync_client=True) as client:
            deployment = wait_for(
                lambda: client.read_deployment_by_name(f"rl-eval/{EVAL_DEPLOYMENT}"),
                180,
                "the deployment",
                serve,
            )
            completed = FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))
            )
            (run, *_) = wait_for(
                lambda: client.read_flow_runs(
                    flow_run_filter=completed,
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                ),
                240,
                "a completed scheduled evaluation",
                serve,
            )
            artifacts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
            )
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        kill_marked(marker)
    print(f"a scheduled evaluation completed {time.time() - started:.0f} s after serve started")
    assert run.auto_scheduled and run.name == f"{run_dir.name}/eval", (run, log.read_text()[-3000:])
    assert (deployment.schedules[0].schedule.interval.total_seconds(), deployment.parameters["run_dir"]) == (
        3,
        str(run_dir),
    )
    document = EvalResults(str(run_dir / "checkpoints")).read_step(2)
    assert document is not None
    by_key = {a.key: a for a in artifacts}
    table = by_key[artifact_key(run_dir.name, "eval")]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [(r["dataset"], r["step"], r["reward_mean"]) for r in rows] == [
        ("val", 2, round(document["datasets"]["val"]["reward_mean"], 6))
    ]
    curve = by_key[artifact_key(run_dir.name, "eval-curve")]
    image = re.search(r"\]\(data:image/svg\+xml;base64,([^)]+)\)", curve.data)
    assert image is not None
    lines = ET.fromstring(base64.b64decode(image[1])).iter("{http://www.w3.org/2000/svg}polyline")
    assert [line.get("data-label") for line in lines] == ["val"]
