"""The async modes on real Ray actors: partial rollouts across a weight push, and short runs."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.model.loading import load_policy
from rl_train.engines.rollout.tool_env import ToolEnvConfig
from rl_train.engines.weight_sync.backends import NaiveBackend
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.storage.metrics import read_metrics
from rl_train.storage.transfer_queue import TransferQueue

pytestmark = pytest.mark.integration
N = 16


def _wait_for(predicate: Any, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_partial_rollout_resumes_under_new_weights_with_two_versions(tiny_model_dir: Path, ray_local) -> None:
    tq = ray.remote(TransferQueue).options(num_cpus=0).remote()
    worker = (
        ray.remote(RolloutWorker).options(num_cpus=0, max_concurrency=2).remote(str(tiny_model_dir), tq, 0, 1)
    )
    ray.get(worker.open_receiver.remote(NaiveBackend(), {}))
    prompt = {"prompt": "3+4=", "data_source": "single_digit_sum", "ground_truth": "7"}
    ray.get(
        tq.put.remote("train", {"p0": prompt}, {"p0": {"kind": "prompt", "status": "pending", "version": 0}})
    )
    # 16 hot samples of up to 64 tokens: the longest runs for many decode steps, so the
    # pause below lands while the group is still generating.
    worker.enqueue.remote("train", ["p0"], N, {"temperature": 3.0, "top_p": 1.0, "max_new_tokens": 64})
    _wait_for(lambda: ray.get(tq.get_tags.remote("train", ["p0"]))[0]["status"] == "running")
    ray.get(worker.pause_generation.remote())  # abort at the next token: the group stays partial
    # the pause returns once the engine has stopped; the batch then writes what it got
    _wait_for(lambda: ray.get(tq.get_tags.remote("train", ["p0"]))[0]["status"] != "running")
    tag = ray.get(tq.get_tags.remote("train", ["p0"]))[0]
    assert tag["status"] == "pending" and tag["partial"]
    keys = [f"p0/{j}" for j in range(N)]
    before = ray.get(tq.get.remote("train", keys))
    aborted = [k for k, r in zip(keys, before, strict=True) if r["stop_reason"] == "aborted"]
    assert aborted
    # However far the abort let it get, give one aborted trajectory two version-0 tokens of
    # its own, so that the continuation's version boundary is known exactly.
    digit = ray.get(worker.encode_prompt.remote("7"))[-1]
    prefix = {"response_ids": [digit, digit], "rollout_log_probs": [-1.0, -2.0], "token_versions": [0, 0]}
    ray.get(tq.put.remote("train", {aborted[0]: prefix}))

    model, _ = load_policy(tiny_model_dir)
    payload = {"version": 1, "tensors": {k: v.detach() for k, v in model.state_dict().items()}}
    ray.get(worker.receive_weights.remote(payload, 1, 30.0))  # pushed while paused
    ray.get(worker.resume_generation.remote())
    _wait_for(lambda: ray.get(tq.get_tags.remote("train", ["p0"]))[0]["status"] == "finished", 60)
    after = dict(zip(keys, ray.get(tq.get.remote("train", keys)), strict=True))
    resumed = after[aborted[0]]
    new_tokens = len(resumed["response_ids"]) - 2
    assert resumed["response_ids"][:2] == [digit, digit] and new_tokens >= 1
    assert resumed["token_versions"] == [0, 0] + [1] * new_tokens  # two weight versions
    assert resumed["rollout_log_probs"][:2] == [-1.0, -2.0]
    assert ray.get(tq.get_tags.remote("train", [aborted[0]]))[0]["version"] == 0
    for record in after.values():
        assert (
            len(record["token_versions"]) == len(record["response_ids"]) == len(record["rollout_log_probs"])
        )
        assert record["stop_reason"] in ("eos", "length")
    assert ray.get(worker.pop_generation_errors.remote()) == []
    ray.kill(worker)
    ray.kill(tq)


LONG_TAIL = {"name": "long_tail_sandbox", "latency_median_seconds": 0.02, "latency_max_seconds": 2.0}
"""Sandbox latency of the mode tests: p50 20 ms, p99 0.5 s; staleness bounds must hold under it."""


def test_a_push_marked_off_version_marks_the_records_until_the_next_push(tiny_model_dir: Path, ray_local) -> None:
    """A replica revived mid-step gets the trainer's current weights under pi_old's version:
    what it samples under them says ``off_version`` (never copied as pi_old's log-probs), and
    what it samples after the next push does not."""
    tq = ray.remote(TransferQueue).options(num_cpus=0).remote()
    worker = ray.remote(RolloutWorker).options(num_cpus=0).remote(str(tiny_model_dir), tq, 0, 1)
    ray.get(worker.open_receiver.remote(NaiveBackend(), {}))
    model, _ = load_policy(tiny_model_dir)
    prompt = {"prompt": "3+4=", "data_source": "single_digit_sum", "ground_truth": "7"}
    params = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4}

    def sample(key: str, version: int, off_version: bool) -> list[dict[str, Any]]:
        if off_version:
            ray.get(worker.mark_next_push_off_version.remote())
        payload = {"version": version, "tensors": {k: v.detach() for k, v in model.state_dict().items()}}
        ray.get(worker.receive_weights.remote(payload, version, 30.0))
        ray.get(tq.put.remote("train", {key: prompt}, {key: {"kind": "prompt", "status": "pending", "version": 0}}))
        return ray.get(tq.get.remote("train", ray.get(worker.generate_prompts.remote("train", [key], 2, params))))

    before = sample("a", 1, off_version=False)
    revived = sample("b", 1, off_version=True)
    after = sample("c", 2, off_version=False)
    assert [r.get("off_version", False) for r in before + revived + after] == [False, False, True, True, False, False]
    assert all(set(r["token_versions"]) == {v} for v, rs in ((1, before), (1, revived), (2, after)) for r in rs)


def test_tool_calls_keep_a_group_running_until_its_slowest_call_returns(
    tiny_model_dir: Path, ray_local
) -> None:
    tool_env = {"name": "long_tail_sandbox", "latency_median_seconds": 0.3, "latency_sigma": 0.5}
    tq = ray.remote(TransferQueue).options(num_cpus=0).remote()
    worker = (
        ray.remote(RolloutWorker)
        .options(num_cpus=0, max_concurrency=2)
        .remote(str(tiny_model_dir), tq, 0, 1, tool_env)
    )
    prompt = {"prompt": "3+4=", "data_source": "arith/single_digit_sum", "ground_truth": "7"}
    rows = {f"p{i}": dict(prompt) for i in range(3)}
    ray.get(
        tq.put.remote("train", rows, {k: {"kind": "prompt", "status": "pending", "version": 0} for k in rows})
    )
    params = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4}
    worker.enqueue.remote("train", ["p0"], 4, params)
    _wait_for(lambda: ray.get(tq.count.remote("train", group_id="p0")) == 4)
    records = ray.get(tq.get.remote("train", [f"p0/{j}" for j in range(4)]))
    latency = ToolEnvConfig(**tool_env).build()
    assert latency is not None
    assert [r["tool_latency_seconds"] for r in records] == [latency(f"p0/{j}") for j in range(4)]
    # Generated but not finished: the group waits for its slowest sandbox call, in the background.
    assert ray.get(tq.get_tags.remote("train", ["p0"]))[0]["status"] == "running"
    assert ray.get(worker.pop_activity.remote())["groups_awaiting_tools"] == 1
    _wait_for(lambda: ray.get(tq.get_tags.remote("train", ["p0"]))[0]["status"] == "finished", 10)
    assert time.time() >= max(r["tool_done_at"] for r in records)
    # The blocking call (sync mode) returns only once every tool call has returned.
    started = time.time()
    ray.get(worker.generate_prompts.remote("train", ["p1", "p2"], 4, params))
    slowest = max(latency(f"p{i}/{j}") for i in (1, 2) for j in range(4))
    assert time.time() - started >= slowest
    assert [t["status"] for t in ray.get(tq.get_tags.remote("train", ["p1", "p2"]))] == ["finished"] * 2
    assert ray.get(worker.pop_generation_errors.remote()) == []
    ray.kill(worker)
    ray.kill(tq)


def _async_config(small_run_config: dict[str, Any], mode: str, **trainer: Any) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(mode=mode, **trainer)
    cfg["rollout"]["tool_env"] = LONG_TAIL
    apply_mode_defaults(cfg)  # as load_config does: colocate_async's threshold keeps staleness <= 1
    return Config.model_validate(cfg)


def test_colocate_async_three_steps_through_prefect_staleness_at_most_one(
    small_run_config: dict[str, Any], ray_local, prefect_harness
) -> None:
    from rl_train.flows.train import train_flow

    config = _async_config(small_run_config, "colocate_async")
    state = train_flow(resolved=config.model_dump(mode="json"), return_state=True)
    assert state.is_completed(), state
    metrics = read_metrics(state.result()["run_dir"])
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["replay/staleness_max"] <= 1, m
        assert 0.0 <= m["rollout/idle_fraction"] < 1.0 and m["rollout/busy_seconds"] > 0
        assert m["rollout/rows_per_engine_batch"] >= 1.0  # requests per engine batch run
        assert m["rollout/version/0"] == m["step"]  # the replica serves the weights just pushed
        assert 0.0 <= m["reward/mean"] <= 1.0 and "actor/loss" in m
    assert metrics[1]["replay/staleness_max"] == 1  # step 2 trains the prefetched, version-0 groups
    assert "val/reward_mean" in metrics[-1]


def _separate_config(small_run_config: dict[str, Any], backend: str = "bucketed", **replay: Any) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(
        mode="separate_async", total_steps=2, parameter_sync_step=2, use_prefect=False, val_every_steps=0
    )
    cfg["rollout"]["weight_sync"] = {"backend": backend, "transport": "shm", "bucket_size_bytes": 1 << 16}
    cfg["rollout"]["tool_env"] = LONG_TAIL
    cfg["replay"] = replay
    apply_mode_defaults(cfg)
    return Config.model_validate(cfg)


@pytest.mark.parametrize("backend", ["bucketed", "delta"])
def test_separate_async_two_global_steps_staleness_within_parameter_sync_step(
    small_run_config: dict[str, Any], ray_local, backend: str
) -> None:
    from rl_train.flows.train import run_training

    summary = run_training(_separate_config(small_run_config, backend))
    metrics = read_metrics(summary["run_dir"])
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["replay/staleness_max"] <= 2  # parameter_sync_step
        assert m["rollout/version/0"] in (m["step"] - 1, m["step"])  # the push is not awaited
        assert "actor/loss" in m and m["replay/rescue_activations"] == 0
    assert metrics[1]["weight_sync/bytes"] > 0  # step 1's push, awaited at step 2's end


class _PausedPoolTrainer:
    """separate_async whose standalone pool is paused from the start: only rescue can feed it."""

    def __new__(cls, config: Config) -> Any:
        from rl_train.flows.separate_async import SeparateAsyncTrainer

        class Paused(SeparateAsyncTrainer):
            def on_train_begin(self) -> None:
                self.pools.rollout.pause_generation()
                super().on_train_begin()

        return Paused(config)


def test_separate_async_rescue_feeds_the_trainer_when_the_pool_is_paused(
    small_run_config: dict[str, Any], ray_local
) -> None:
    trainer = _PausedPoolTrainer(_separate_config(small_run_config, rescue_after_seconds=0.5))
    history = trainer.fit()
    assert len(history) == 2
    for m in history:
        assert m["replay/rescue_activations"] == 2  # one per local update
        assert m["replay/rescue_groups"] == 8 and "actor/loss" in m
        # the spare engine samples with the trainer's current weights: never copied as pi_old's
        assert m["rollout_corr/old_log_probs_copied"] == 0.0
