"""A worker process that dies mid-step does not end the run (R-10.2): Ray restarts it; a
rollout replica is reloaded with the weights rollout serves now and its prompts start over;
a reward worker's task is retried. Every prompt is still trained exactly once."""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.reward.metrics import ScoredSample
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.flows.registry import get_trainer_class
from rl_train.flows.resume import LEDGER_FILE
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

MARKERS = Path(tempfile.gettempdir()) / f"rlt-die-{uuid.uuid4().hex[:8]}"
"""One file per worker kind that has died once: its restarted process must live."""
atexit.register(shutil.rmtree, MARKERS, True)


def _die_once(kind: str, calls: int, on_call: int) -> None:
    marker = MARKERS / kind
    if calls == on_call and not marker.exists():
        MARKERS.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        os._exit(1)  # the process is gone, as after a segfault or the OOM killer


class DyingRolloutWorker(RolloutWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        engine_generate = self.engine.generate

        def generate(requests: Any, params: Any) -> Any:
            self.calls += 1
            _die_once("rollout", self.calls, 2)  # mid-step 2, in the middle of generation
            return engine_generate(requests, params)

        self.engine.generate = generate  # type: ignore[method-assign]


class DyingRewardWorker(RewardWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def score(self, partition: str, keys: list[str]) -> list[ScoredSample]:
        self.calls += 1
        _die_once("reward", self.calls, 3)
        return super().score(partition, keys)


def _run(small_run_config: dict[str, Any], mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode=mode, use_prefect=False, val_every_steps=0, total_steps=4)
    data["replay"] = {"max_off_policy_threshold": 100}
    apply_mode_defaults(data)
    base = get_trainer_class(mode)
    classes = WorkerClasses(rollout=DyingRolloutWorker, reward=DyingRewardWorker)
    trainer = type(f"Dying{base.__name__}", (base,), {"worker_classes": classes})(Config.model_validate(data))
    assert len(trainer.fit()) == 4
    ledger = [json.loads(line) for line in Path(trainer.run_dir, LEDGER_FILE).read_text().splitlines()]
    return read_metrics(trainer.run_dir), ledger


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_a_rollout_and_a_reward_worker_die_and_the_run_trains_every_prompt_once(
    small_run_config: dict[str, Any], ray_local, mode: str
) -> None:
    for marker in MARKERS.glob("*"):
        marker.unlink()
    metrics, ledger = _run(small_run_config, mode)
    assert {p.name for p in MARKERS.glob("*")} == {"rollout", "reward"}  # both really died
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert sum(m["rollout/revived_replicas"] for m in metrics) == 1.0
    counts = Counter(group for row in ledger for group in row["groups"])
    assert sum(counts.values()) == 4 * 8 and max(counts.values()) == 1
