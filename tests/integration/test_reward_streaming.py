"""Streaming scores on real Ray actors (``reward.streaming``): groups are scored as rollout
finishes them, a batch is sampled only once its scores are in, a late grader leaves rollout
running, and a reward worker that dies mid-stream loses no score for good."""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.bench import late_grader
from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.flows.registry import get_trainer_class
from rl_train.flows.resume import LEDGER_FILE
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

MARKER = Path(tempfile.gettempdir()) / f"rlt-reward-died-{uuid.uuid4().hex[:8]}"


class DyingRewardWorker(RewardWorker):
    """Dies (the process gone) in its second background scoring, once: what it had queued is lost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.background_calls = 0

    def score_groups(self, partition: str, groups: list[str], n: int) -> int:
        self.background_calls += 1
        if self.background_calls == 2 and not MARKER.exists():
            MARKER.write_text(str(os.getpid()))
            os._exit(1)
        return super().score_groups(partition, groups, n)


def _fit(data: dict[str, Any], classes: WorkerClasses | None = None) -> tuple[list[dict[str, Any]], Counter[str]]:
    apply_mode_defaults(data)
    mode = data["trainer"]["mode"]
    base = get_trainer_class(mode)
    cls = type(f"Streaming{base.__name__}", (base,), {"worker_classes": classes}) if classes else base
    trainer = cls(Config.model_validate(data))
    trainer.fit()
    ledger = [json.loads(line) for line in Path(trainer.run_dir, LEDGER_FILE).read_text().splitlines()]
    return read_metrics(trainer.run_dir), Counter(g for row in ledger for g in row["groups"])


def _config(small_run_config: dict[str, Any], mode: str, steps: int, **reward: Any) -> dict[str, Any]:
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode=mode, use_prefect=False, val_every_steps=0, total_steps=steps)
    data["replay"] = {"max_off_policy_threshold": 100}
    data["reward"] = reward
    return data


def test_separate_async_rollout_keeps_producing_while_a_late_grader_lags(
    small_run_config: dict[str, Any], ray_local
) -> None:
    """A grader that sleeps a second a batch: groups finish faster than they are scored (some wait,
    finished and unscored, when a batch is sampled), and every trained sample was scored in the
    background before its batch was sampled (the reward phase only read the scores back)."""
    data = _config(small_run_config, "separate_async", 2, by_data_source={"arith": late_grader.GRADER})
    data["trainer"]["parameter_sync_step"] = 2
    data["rollout"]["weight_sync"] = {"backend": "bucketed", "transport": "shm"}
    metrics, trained = _fit(data)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["reward/streamed"] == 1.0 for m in metrics), [m.get("reward/streamed") for m in metrics]
    assert max(m["replay/awaiting_scores_max"] for m in metrics) > 0  # finished > scored, for a while
    assert sum(m["rollout/tokens_per_second"] for m in metrics) > 0, [
        (m["rollout/tokens_per_second"], m["rollout/busy_seconds"]) for m in metrics
    ]
    assert sum(trained.values()) == 2 * 8 and max(trained.values()) == 1


def test_sync_mode_streams_scores_when_asked_and_trains_each_prompt_once(
    small_run_config: dict[str, Any], ray_local
) -> None:
    metrics, trained = _fit(_config(small_run_config, "sync", 2, streaming=True))
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["reward/streamed"] == 1.0 for m in metrics)  # the buffer sampled scored groups only
    assert sum(trained.values()) == 2 * 8 and max(trained.values()) == 1


def test_a_reward_worker_killed_mid_stream_loses_no_score_for_good(small_run_config: dict[str, Any], ray_local) -> None:
    """Its queue is lost with it: the async buffer hands the unscored groups again, the restarted
    worker scores them, and the run trains every prompt once."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    MARKER.unlink(missing_ok=True)
    data = _config(small_run_config, "colocate_async", 3)
    metrics, trained = _fit(data, WorkerClasses(reward=DyingRewardWorker))
    assert MARKER.exists()  # it really died
    MARKER.unlink()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert sum(trained.values()) == 3 * 8 and max(trained.values()) == 1
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in metrics)
