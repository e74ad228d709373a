"""The ``eval/`` folder beside a run's checkpoints, on local disk and on a real local S3 server,
and the evaluation page built from it (results table, per-dataset reward curve)."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from rl_train.flows.eval_page import eval_curve_markdown, eval_series, results_table
from rl_train.storage.checkpoint import CheckpointStore
from rl_train.storage.eval_results import EvalResults, latest_rewards


@pytest.fixture(params=["local", "s3"])
def checkpoint_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return str(tmp_path / "checkpoints"), None
    return request.getfixturevalue("s3_root")


def test_step_documents_and_history_round_trip(checkpoint_root: tuple[str, dict[str, Any] | None]) -> None:
    root, options = checkpoint_root
    results = EvalResults(root, options)
    assert results.read_step(3) is None and results.history() == []
    results.write_step(3, {"step": 3, "datasets": {"val": {"reward_mean": 0.25}}})
    results.append_history([{"step": 3, "dataset": "val", "reward": 0.25}])
    results.append_history(
        [{"step": 5, "dataset": "val", "reward": 0.5}, {"step": 5, "dataset": "hard", "reward": 0.1}]
    )
    reopened = EvalResults(root, options)  # nothing cached: a later flow run reads what this one wrote
    assert reopened.read_step(3) == {"step": 3, "datasets": {"val": {"reward_mean": 0.25}}}
    assert [(r["step"], r["dataset"]) for r in reopened.history()] == [(3, "val"), (5, "val"), (5, "hard")]
    assert results.step_uri(3) == f"{root}/eval/step-00000003.json"


def test_results_live_where_the_checkpoint_store_never_looks(
    checkpoint_root: tuple[str, dict[str, Any] | None],
) -> None:
    root, options = checkpoint_root
    store = CheckpointStore(root, keep_last=1, storage_options=options)
    for step in (1, 2):
        store.commit(step, [store.write_bytes(step, "policy/model.bin", b"w" * step)], {})
    EvalResults(root, options).write_step(1, {"step": 1})
    EvalResults(root, options).append_history([{"step": 1, "dataset": "val", "reward": 0.0}])
    store.commit(3, [store.write_bytes(3, "policy/model.bin", b"www")], {})  # prunes steps 1 and 2
    assert store.complete_steps() == [3] and store.latest_valid() == 3
    assert EvalResults(root, options).read_step(1) == {"step": 1}  # an evaluation outlives its checkpoint
    assert len(EvalResults(root, options).history()) == 1


def test_a_non_finite_reward_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    results = EvalResults(str(tmp_path))
    with pytest.raises(ValueError):
        results.write_step(1, {"reward_mean": float("nan")})
    with pytest.raises(ValueError):
        results.append_history([{"step": 1, "dataset": "val", "reward": float("inf")}])
    assert results.read_step(1) is None and results.history() == []


def test_history_without_a_final_newline_is_appended_to_cleanly(tmp_path: Path) -> None:
    results = EvalResults(str(tmp_path))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "history.jsonl").write_text('{"step": 1, "dataset": "val", "reward": 0.5}')
    results.append_history([{"step": 2, "dataset": "val", "reward": 0.75}])
    assert [r["reward"] for r in results.history()] == [0.5, 0.75]


HISTORY = [
    {"step": 2, "dataset": "val", "reward": 0.1},
    {"step": 2, "dataset": "hard", "reward": 0.0},
    {"step": 4, "dataset": "val", "reward": 0.3},
    {"step": 2, "dataset": "val", "reward": 0.2},  # step 2 re-evaluated (force): this one counts
    {"step": 6, "dataset": "val", "reward": 0.5},
]


def test_the_latest_evaluation_of_a_step_counts() -> None:
    assert latest_rewards(HISTORY) == {"val": {2: 0.2, 4: 0.3, 6: 0.5}, "hard": {2: 0.0}}


def test_eval_curve_has_one_line_per_dataset_validation_first() -> None:
    series = eval_series(HISTORY)
    assert [s.label for s in series] == ["val", "hard"]
    assert series[0].points == ((2.0, 0.2), (4.0, 0.3), (6.0, 0.5))
    markdown = eval_curve_markdown("my-run", HISTORY)
    assert markdown.startswith("# Evaluation reward of my-run\n")
    assert "| val | 3 | 0.2000 | 0.5000 | 0.5000 |" in markdown
    assert "| hard | 1 | 0.0000 | 0.0000 | 0.0000 |" in markdown
    image = re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", markdown)
    assert image is not None
    svg = ET.fromstring(base64.b64decode(image[1]))
    labels = [line.get("data-label") for line in svg.iter("{http://www.w3.org/2000/svg}polyline")]
    assert labels == ["val", "hard"]


def test_results_table_has_a_row_per_dataset() -> None:
    entry = {"reward_mean": 1 / 3, "count": 6, "num_prompts": 3, "settings": {"temperature": 0.0, "n": 2}}
    assert results_table(7, {"val": entry}) == [
        {
            "dataset": "val",
            "step": 7,
            "reward_mean": 0.333333,
            "count": 6,
            "prompts": 3,
            "temperature": 0.0,
            "n": 2,
        }
    ]
