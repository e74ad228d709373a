"""A sync run on the built-in tool task: prompts answered by the tool agent loop, trajectories
stored with their observation mask, scored on their last turn, trained on, and reported under
``agent/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sync_run import fit_sync_run

from rl_train.storage.builtin_data import write_builtin_task


def test_a_sync_run_trains_on_tool_agent_trajectories(
    small_run_config: dict[str, Any], tmp_path: Path, ray_local: Any
) -> None:
    from rl_train.engines.model.tiny import create_tiny_policy

    model = create_tiny_policy(tmp_path / "tool-model", seed=0, pretrain_steps=30, pretrain_task="tool_sum", prior_correct=0.5)
    write_builtin_task("tool_sum", tmp_path / "tool-data")
    trainer = fit_sync_run(
        small_run_config,
        2,
        model={"path": str(model)},
        data={"data_dir": str(tmp_path / "tool-data")},
        rollout={"agent": {"max_turns": 2, "max_response_tokens": 96}},
    )
    rows = [json.loads(line) for line in Path(trainer.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["agent/trajectories"] == 32  # 8 prompts x 4 samples, every one through the tool loop
        assert 1 <= row["agent/turns_mean"] <= 2
        assert 0 < row["agent/observation_token_frac"] < 1 or row["agent/tool_calls_mean"] == 0
        assert "reward/mean" in row
        # a turn after a tool continued from the keys and values its first turn kept
        assert (row["rollout/kv_reused_tokens"] > 0) == (row["agent/turns_mean"] > 1), row


CRASHES_ON = """
import os, runpy, sys
if os.environ["RL_TRAIN_TASK"] == {prompt!r}:  # that prompt's agents crash before any request
    sys.exit(1)
runpy.run_module("rl_train.examples.calculator_agent", run_name="__main__")
"""


def test_a_sync_run_trains_on_black_box_agents_through_the_gateway(
    small_run_config: dict[str, Any], tmp_path: Path, ray_local: Any
) -> None:
    """Every trajectory is the example agent (the official openai client), run as a sandboxed
    process, talking to the replica's gateway; the run trains on the sessions' records. The
    agents of one prompt of the first step crash: that prompt alone is evicted and refilled
    (the agent cannot keep a note between runs to crash only once: its sandbox forgets), and
    every step trains on complete groups."""
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl_train.engines.model.tiny import create_tiny_policy
    from rl_train.storage.dataset import PromptLoader

    model = create_tiny_policy(tmp_path / "tool-model", seed=0, pretrain_steps=30, pretrain_task="tool_sum", prior_correct=0.5)
    write_builtin_task("tool_sum", tmp_path / "tool-data")
    for split in ("train", "val"):
        path = tmp_path / "tool-data" / f"{split}.parquet"
        rows = [{**row, "agent_name": "gateway_agent"} for row in pq.read_table(path).to_pylist()]
        pq.write_table(pa.Table.from_pylist(rows), path)
    train = pq.read_table(tmp_path / "tool-data" / "train.parquet").to_pylist()
    crashing = PromptLoader(train, seed=0).take(4)[3][1]["prompt"]  # the run's fourth prompt (run.seed 0)
    command = [sys.executable, "-c", CRASHES_ON.format(prompt=crashing)]  # the program on argv: the sandbox hides /tmp
    trainer = fit_sync_run(
        small_run_config,
        2,
        model={"path": str(model)},
        data={"data_dir": str(tmp_path / "tool-data")},
        rollout={"agent": {"max_turns": 2, "max_response_tokens": 96, "tool_threads": 8, "gateway_command": command}},
        replay={"refill_failed_groups": True},
    )
    rows = [json.loads(line) for line in Path(trainer.run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["agent/trajectories"] == 32 and 1 <= r["agent/turns_mean"] <= 2 for r in rows)
    # the crashed prompt's group, and only it, was replaced by a fresh prompt
    assert [r["replay/evicted_failure"] for r in rows] == [1.0, 0.0] and [r["replay/refill"] for r in rows] == [1.0, 0.0]
