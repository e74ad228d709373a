"""A phase task in a fresh process rejoins a live run from its id, and says so when it is gone.

This is what a Prefect retry in a new worker process does: it gets ``(run_id, batch_id)``
and nothing else. The child process connects to the run's Ray cluster (``RAY_ADDRESS``)
and runs the real task functions against the run's named actors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from rl_train.config import Config, load_config

CHILD = """
import json, sys
from rl_train import tasks
run_id, batch_id = sys.argv[1], sys.argv[2]
try:
    out = {"reward": tasks.reward.fn(run_id, batch_id), "balance": tasks.balance.fn(run_id, batch_id)}
    tasks.old_log_prob.fn(run_id, batch_id)
    out["advantage"] = tasks.advantage.fn(run_id, batch_id)
    out["update"] = tasks.update.fn(run_id, batch_id)
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
print("RESULT " + json.dumps(out))
"""


def _child(run_id: str, batch_id: str, address: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env["RAY_ADDRESS"] = address
    done = subprocess.run(
        [sys.executable, "-c", CHILD, run_id, batch_id], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"child printed no result:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_task_in_a_fresh_process_rejoins_the_run_and_fails_clearly_once_it_is_gone(
    small_run_config: dict[str, Any], ray_local
) -> None:
    from rl_train import tasks
    from rl_train.flows.train import build_trainer

    config: Config = load_config(None, [])
    config = Config.model_validate({**config.model_dump(), **small_run_config})
    trainer = build_trainer(config)
    trainer.init()
    address = ray_local.get_runtime_context().gcs_address
    try:
        batch_id = tasks.generate.fn(trainer.replay_buffer, 1, 4)
        joined = _child(trainer.run_id, batch_id, address)
        assert "error" not in joined, joined
        assert 0.0 <= joined["reward"]["reward/mean"] <= 1.0
        assert joined["balance"]["response_length/mean"] > 0
        assert "advantage/mean" in joined["advantage"] and "actor/loss" in joined["update"]
        keys = trainer.pools.queue.batch(batch_id)["keys"]
        records = trainer.pools.queue.records.get("train", keys)
        assert all("advantages" in r and "reward" in r for r in records)  # written by the child's tasks
        no_cluster = _child(trainer.run_id, batch_id, None)
        assert no_cluster["error"] == "RunGoneError" and "RAY_ADDRESS" in no_cluster["message"]
    finally:
        trainer.teardown()
    gone = _child(trainer.run_id, batch_id, address)
    assert gone["error"] == "RunGoneError"
    assert trainer.run_id in gone["message"] and "gone" in gone["message"]
