"""Resume (R-9.3): a run stopped mid-way and started again on its run directory continues from
its newest complete checkpoint, trains every prompt once, and (sync, fixed seed) ends with the
very weights of a run that was never stopped."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from safetensors.torch import load_file

from rl_train.config import Config
from rl_train.flows.registry import get_trainer_class
from rl_train.flows.resume import LEDGER_FILE
from rl_train.flows.train import run_training
from rl_train.storage.checkpoint import CheckpointStore
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration


class Stop(RuntimeError):
    """Stands in for a crash: the run ends with an error at the start of a step."""


@contextmanager
def stop_at(mode: str, step: int) -> Iterator[None]:
    cls = get_trainer_class(mode)
    original = cls.on_step_begin

    def on_step_begin(self: Any, current: int) -> None:
        if current == step:
            raise Stop(f"stopped at step {current}")
        original(self, current)

    with mock.patch.object(cls, "on_step_begin", on_step_begin):
        yield


def _config(base: dict[str, Any], name: str, **trainer: Any) -> Config:
    cfg = copy.deepcopy(base)
    cfg["run"]["name"] = name
    cfg["trainer"].update({"use_prefect": False, "val_every_steps": 0, **trainer})
    cfg["checkpoint"] = {"every_steps": 2, "keep_last": 2}
    return Config.model_validate(cfg)


def _ledger(run_dir: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(run_dir, LEDGER_FILE).read_text().splitlines()]


def _weights(run_dir: str) -> dict[str, Any]:
    return load_file(str(Path(run_dir, "policy", "model.safetensors")))


def test_sync_resume_ends_bitwise_equal_to_an_unstopped_run_and_a_finished_run_is_not_run_again(
    small_run_config: dict[str, Any], ray_local
) -> None:
    straight = run_training(_config(small_run_config, "straight", total_steps=4))
    stopped = _config(small_run_config, "stopped", total_steps=4)
    with stop_at("sync", 4), pytest.raises(Stop):
        run_training(stopped)
    run_dir = straight["run_dir"].replace("straight", "stopped")
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]  # step 3 is past checkpoint 2
    assert CheckpointStore(f"{run_dir}/checkpoints").complete_steps() == [2]

    resumed = run_training(_config(small_run_config, "stopped", total_steps=4))  # the same command again
    assert [m["step"] for m in read_metrics(resumed["run_dir"])] == [1, 2, 3, 4]
    assert _ledger(resumed["run_dir"]) == _ledger(straight["run_dir"])
    a, b = _weights(straight["run_dir"]), _weights(resumed["run_dir"])
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in a), [k for k in a if not a[k].equal(b[k])]
    assert [m["reward/mean"] for m in read_metrics(resumed["run_dir"])] == [
        m["reward/mean"] for m in read_metrics(straight["run_dir"])
    ]

    # A finished run is not run again: the same command once more trains nothing.
    again = run_training(_config(small_run_config, "straight", total_steps=4))
    assert again["steps"] == 4
    assert [m["step"] for m in read_metrics(again["run_dir"])] == [1, 2, 3, 4]
    assert _weights(again["run_dir"]).keys() == a.keys()
    assert all(_weights(again["run_dir"])[k].equal(a[k]) for k in a)


def test_async_resume_trains_every_prompt_once(small_run_config: dict[str, Any], ray_local) -> None:
    config = _config(small_run_config, "async", total_steps=5, mode="colocate_async")
    config.replay.max_off_policy_threshold = 100  # nothing is evicted, so every prompt must be trained
    with stop_at("colocate_async", 4), pytest.raises(Stop):
        run_training(config)
    summary = run_training(config.model_copy(deep=True))
    assert [m["step"] for m in read_metrics(summary["run_dir"])] == [1, 2, 3, 4, 5]
    ledger = _ledger(summary["run_dir"])
    assert [row["step"] for row in ledger] == [1, 2, 3, 4, 5]
    counts = Counter(group for row in ledger for group in row["groups"])
    assert counts and max(counts.values()) == 1, [g for g, c in counts.items() if c > 1]
    indices = sorted(int(g[1:]) for g in counts)
    # the groups trained are the first ones drawn, bar those still in flight at the end
    assert indices[: len(indices) // 2] == list(range(len(indices) // 2))


def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_one_is_used(
    small_run_config: dict[str, Any], ray_local, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(small_run_config, "corrupt", total_steps=3)
    config.checkpoint.every_steps = 1
    with stop_at("sync", 3), pytest.raises(Stop):
        run_training(config)
    run_dir = f"{config.run.output_dir}/corrupt"
    store = CheckpointStore(f"{run_dir}/checkpoints")
    assert store.complete_steps() == [1, 2]
    # The trainer's engine state, which a resume loads and checks as it reads (the quick check
    # before it finds the file present and of its size).
    victim = Path(store.step_uri(2), "actor", "rank-0", "engine.safetensors")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    victim.write_bytes(bytes(data))

    with caplog.at_level("WARNING"):
        summary = run_training(config.model_copy(deep=True))
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "step-00000002" in warned and victim.name in warned, warned
    assert [m["step"] for m in read_metrics(summary["run_dir"])] == [1, 2, 3]
    ledger = _ledger(summary["run_dir"])
    assert [row["step"] for row in ledger] == [1, 2, 3]
