"""A training run on a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): run
as ``python multi_node_run.py MODEL_DIR DATA_DIR OUT_DIR``, it prints one JSON line with where
each training rank and rollout replica ran and the run's metrics. Its own process: the cluster
is this script's, not the test session's Ray."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from typing import Any

import ray
from ray.cluster_utils import Cluster

from rl_train.config import Config, apply_mode_defaults
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics


def main() -> None:
    model_dir, data_dir, out_dir = sys.argv[1:4]
    ray_dir = tempfile.mkdtemp(prefix="rlt-ray-cluster-")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": ray_dir})
    cluster.add_node(num_cpus=1)
    try:
        data: dict[str, Any] = {
            "run": {"name": "two-nodes", "output_dir": out_dir},
            "model": {"path": model_dir, "create_if_missing": False},
            "data": {"builtin_task": None, "data_dir": data_dir},
            "trainer": {"mode": "sync", "total_steps": 2, "train_batch_size": 8, "use_prefect": False,
                        "val_every_steps": 0, "val_before_train": False},
            "rollout": {"n": 4, "max_new_tokens": 4, "num_threads": 1, "num_replicas": 2,
                        "weight_sync": {"backend": "bucketed", "transport": "tcp"}},
            "actor": {"num_threads": 1, "num_ranks": 2},
            "ray": {"address": cluster.address, "spread": True},
        }  # fmt: skip
        apply_mode_defaults(data)
        placement: dict[str, Any] = {}
        base = get_trainer_class("sync")

        class Recorded(base):  # type: ignore[misc, valid-type]
            def on_train_begin(self) -> None:
                placement.update(self.pools.placement())
                super().on_train_begin()

        trainer = Recorded(Config.model_validate(data))
        trainer.fit()
        nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        print(json.dumps({"placement": placement, "nodes": nodes, "metrics": read_metrics(trainer.run_dir)}))
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
