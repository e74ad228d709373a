"""Pools spread over a two-node Ray cluster (two raylets on this machine, ``multi_node_run.py``
in a process of its own): the two data-parallel training ranks land on different nodes and
meet at rank 0's node address; the two rollout replicas land on different nodes too, so the
weights reach one of them from the other node, over TCP from the sender's node address, each
step; the run trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_train.storage.builtin_data import write_builtin_task

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("multi_node_run.py")


def test_a_run_spread_over_two_nodes_trains_with_dp2_and_syncs_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    write_builtin_task("single_digit_sum", tmp_path / "data")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("GLOO_SOCKET_IFNAME", None)  # the ranks must find their node's interface themselves
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_model_dir), str(tmp_path / "data"), str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    placement, nodes = result["placement"], result["nodes"]
    assert len(nodes) == 2
    assert placement["trainer-0"]["node_id"] != placement["trainer-1"]["node_id"]  # DP2 across the nodes
    # two replicas spread too: one of them gets its weights from trainer-0 on another node
    assert placement["rollout-0"]["node_id"] != placement["rollout-1"]["node_id"]
    assert {where["node_id"] for where in placement.values()} <= set(nodes)
    metrics = result["metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("actor/loss" in m and m["weight_sync/bytes"] > 0 for m in metrics), metrics
