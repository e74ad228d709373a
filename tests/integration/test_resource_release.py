"""A run releases its shared memory, sockets and actors on every exit: normal, error, failed init.

The weight-sync sender owns the run's shared memory (``rlw_*`` segments in /dev/shm, which
outlive a killed process) and its listening socket. The trainer rank here writes the names
and the port it opened to a file, so the test checks exactly this run's endpoints (other
runs may share the machine): after the run, no segment is left, nothing listens on the
port, and no actor of the run is alive.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.workers.pools import WorkerClasses, run_namespace
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.engines.workers.trainer_worker import TrainerWorker
from rl_train.flows.sync import SyncTrainer

pytestmark = pytest.mark.integration

RELEASE_SECONDS = 15.0
"""How long killed actors may take to exit (their sockets close with the process)."""


class RecordingTrainerWorker(TrainerWorker):
    """Writes the sender's endpoints to ``record_dir``; fails its ``fail_at_update``-th update."""

    record_dir = ""
    fail_at_update = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_updates = 0

    def open_sender(self, backend: Any) -> dict[str, Any]:
        descriptor = super().open_sender(backend)
        endpoints = {"port": descriptor["port"], "shm": descriptor.get("names", [])}
        Path(self.record_dir, "sender.json").write_text(json.dumps(endpoints))
        return descriptor

    def update(self, partition: str, keys: list[str], num_mini_batches: int) -> dict[str, float]:
        self.num_updates += 1
        if self.num_updates == self.fail_at_update:
            raise RuntimeError("injected update failure")
        return super().update(partition, keys, num_mini_batches)


class RefusingReceiverRolloutWorker(RolloutWorker):
    """A replica that cannot open its receiver: init fails half-way through opening weight sync."""

    def open_receiver(self, backend: Any, descriptor: dict[str, Any]) -> None:
        raise RuntimeError("injected receiver failure")


class RefusingSampler:
    """A ``replay.sampler`` that fails in its constructor: init fails after the pools exist."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected sampler failure")


def _listening_ports() -> set[int]:
    """Ports in LISTEN state on this host (/proc/net/tcp{,6}, field 4 is the state, 0A)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _run_actors(run_id: str) -> list[str]:
    namespace = run_namespace(run_id)
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]


def _config(small_run_config: dict[str, Any], transport: str, **replay: Any) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(total_steps=2, train_batch_size=2, use_prefect=False, val_every_steps=0)
    cfg["rollout"].update(n=2, max_new_tokens=4)
    cfg["rollout"]["weight_sync"] = {
        "backend": "bucketed",
        "transport": transport,
        "bucket_size_bytes": 1 << 16,
    }
    cfg["replay"] = replay
    apply_mode_defaults(cfg)
    return Config.model_validate(cfg)


CASES = {
    "normal-shm": ("shm", {}, {}, None),
    "normal-tcp": ("tcp", {}, {}, None),
    "update-fails": ("shm", {"fail_at_update": 2}, {}, "injected update failure"),  # in step 2
    "sampler-fails": ("shm", {}, {"sampler": f"{__name__}:RefusingSampler"}, "injected sampler failure"),
    "receiver-fails": ("shm", {"rollout": RefusingReceiverRolloutWorker}, {}, "injected receiver failure"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shared_memory_sockets_and_actors_are_released(
    small_run_config: dict[str, Any], ray_local, tmp_path: Path, case: str
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    transport, options, replay, error = CASES[case]
    rollout = options.get("rollout", RolloutWorker)
    trainer_options = {k: v for k, v in options.items() if k != "rollout"}
    recording = type(
        "RecordingTrainerWorker", (RecordingTrainerWorker,), {"record_dir": str(tmp_path), **trainer_options}
    )

    class Trainer(SyncTrainer):
        worker_classes = WorkerClasses(trainer=recording, rollout=rollout)

    trainer = Trainer(_config(small_run_config, transport, **replay))
    if error is None:
        assert len(trainer.fit()) == 2
    else:
        with pytest.raises(Exception, match=error):
            trainer.fit()

    endpoints = json.loads((tmp_path / "sender.json").read_text())
    assert bool(endpoints["shm"]) == (transport == "shm")  # the check below is not vacuous
    deadline = time.monotonic() + RELEASE_SECONDS
    while True:
        left = {
            "actors": _run_actors(trainer.run_id),
            "shm": [name for name in endpoints["shm"] if os.path.exists(f"/dev/shm/{name}")],
            "listening": endpoints["port"] in _listening_ports(),
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(left.values()), left
