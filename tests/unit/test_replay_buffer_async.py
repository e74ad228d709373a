"""ReplayBufferAsync against a real (plain) TransferQueue; the test plays the rollout replicas."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.replay_buffer_async import ReplayBufferAsync, SampleTimeoutError, load_sampler_class
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2  # group size


class QueueingReplica:
    """The edge of the world: a replica that only records what it was asked to generate."""

    def __init__(self) -> None:
        self.queued: list[str] = []

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        assert partition == "train" and n == N
        self.queued.extend(keys)


def finish(
    tq: TransferQueue, group: str, versions: list[list[int]], rewards: list[float] | None = None
) -> None:
    """Write the group's trajectories (token versions per sample) and mark the prompt finished."""
    records, tags = {}, {}
    for j, token_versions in enumerate(versions):
        key = f"{group}/{j}"
        records[key] = {"group_id": group, "token_versions": token_versions}
        if rewards is not None:
            records[key]["reward"] = rewards[j]
        tags[key] = {"kind": "trajectory", "status": "eos", "group_id": group, "version": min(token_versions)}
    tq.put("train", records, tags)
    if tq.get_tags("train", [group])[0]["status"] == "pending":
        tq.set_tags("train", {group: {"status": "running"}})
    tq.set_tags("train", {group: {"status": "finished"}})


def make(config: ReplayConfig | None = None) -> tuple[ReplayBufferAsync, TransferQueue, QueueingReplica]:
    tq, replica = TransferQueue(), QueueingReplica()
    prompts = [{"prompt": f"q{i}", "data_source": "d", "ground_truth": "0"} for i in range(100)]
    buffer = ReplayBufferAsync(tq, [replica], PromptLoader(prompts), N, {}, config or ReplayConfig())
    return buffer, tq, replica


def test_dispatch_keeps_a_fixed_number_of_groups_outstanding_one_group_at_a_time() -> None:
    buffer, tq, replica = make(ReplayConfig(prefetch_batches=1))
    assert len(buffer.dispatch(2, step=1)) == 4  # 2 groups x (1 + 1 prefetch batch)
    assert replica.queued == ["p0", "p1", "p2", "p3"]  # one enqueue per group
    assert tq.get_tags("train", ["p0"])[0] == {"kind": "prompt", "status": "pending", "step": 1, "version": 0}
    assert buffer.dispatch(2, step=1) == []  # nothing left the queue: nothing to draw
    finish(tq, "p0", [[0], [0]])
    finish(tq, "p1", [[0], [0]])
    buffer.release(buffer.sample(2, step=1))
    assert buffer.dispatch(2, step=2) == ["p4", "p5"]  # exactly the two consumed groups
    assert buffer.loader.position == 6


def test_drop_evicts_a_stale_finished_group_and_refills_exactly_one() -> None:
    buffer, tq, replica = make(ReplayConfig(max_off_policy_threshold=3, prefetch_batches=0))
    tq.put("val", {"v0": {"prompt": "x"}}, {"v0": {"kind": "prompt", "status": "pending"}})
    buffer.dispatch(2, step=1)
    # At step 5 the trainer holds version 4. p0 mixes versions 1 and 4: 4 - 1 = 3 versions
    # behind, R-7.2 staleness 3 + 1 = 4 > 3: evicted.
    finish(tq, "p0", [[1, 1, 4], [4]])
    finish(tq, "p1", [[2], [3]])  # 2 versions behind, staleness 3 = the threshold: kept
    with pytest.raises(SampleTimeoutError):  # p0 evicted, its refill p2 is not generated yet
        buffer.cfg.sample_timeout_seconds = 0.05
        buffer.sample(2, step=5)
    assert tq.query("train", kind="prompt") == ["p1", "p2"]
    assert tq.count("train", group_id="p0") == 0
    assert replica.queued == ["p0", "p1", "p2"] and buffer.loader.position == 3  # one refill, not two
    assert tq.get("val", ["v0"]) == [{"prompt": "x"}]  # validation is never evicted
    finish(tq, "p2", [[4], [4]])
    batch = tq.get_batch(buffer.sample(2, step=5))
    assert batch["groups"] == ["p1", "p2"]  # oldest first
    metrics = buffer.pop_metrics()
    assert metrics["replay/evicted_staleness"] == 1 and metrics["replay/refill"] == 1
    assert metrics["replay/staleness_max"] == 2 and metrics["replay/staleness_mean"] == 1.0


def test_samples_are_taken_oldest_token_version_first() -> None:
    buffer, tq, _ = make(ReplayConfig(prefetch_batches=1))
    buffer.dispatch(2, step=3)
    finish(tq, "p0", [[2], [2]])
    finish(tq, "p1", [[1, 2], [2]])  # a partial rollout: its oldest token is version 1
    finish(tq, "p2", [[2], [2]])
    assert tq.get_batch(buffer.sample(2, step=3))["groups"] == ["p1", "p0"]


def test_wait_blocks_while_a_late_prompt_is_at_the_threshold_and_drops_nothing() -> None:
    buffer, tq, _ = make(
        ReplayConfig(max_off_policy_threshold=3, staleness_strategy="wait", prefetch_batches=0)
    )
    buffer.dispatch(2, step=1)  # p0, p1 dispatched under version 0
    tq.set_tags("train", {"p0": {"status": "running"}})
    finish(tq, "p1", [[0], [0]])
    result: dict[str, str] = {}
    sampler = threading.Thread(target=lambda: result.update(batch=buffer.sample(1, step=3)))
    sampler.start()  # step 3: trainer version 2, p0 is 2 behind, staleness 3 >= 3: sampling blocks
    time.sleep(0.3)
    assert sampler.is_alive() and not result
    finish(tq, "p0", [[0], [0]])  # the late prompt arrives (staleness 2, not dropped under wait)
    sampler.join(timeout=5)
    assert tq.get_batch(result["batch"])["groups"] == ["p0"]  # and it is the oldest
    metrics = buffer.pop_metrics()
    assert metrics["replay/evicted_staleness"] == 0 and metrics["replay/sample_wait_seconds"] >= 0.3


def test_dapo_filter_evicts_groups_without_gradient_and_refills_one_each() -> None:
    buffer, tq, replica = make(ReplayConfig(filter_groups=True, prefetch_batches=1))
    buffer.dispatch(2, step=1)
    finish(tq, "p0", [[0], [0]], rewards=[1.0, 1.0])  # std 0: no gradient
    finish(tq, "p1", [[0], [0]], rewards=[0.0, 1.0])  # kept
    tq.put("train", {"p2/0": {"is_infra": True}})
    finish(tq, "p2", [[0], [0]], rewards=[0.0, 1.0])  # one valid sample left: no gradient
    finish(tq, "p3", [[0], [0]], rewards=[1.0, 0.0])  # kept
    assert tq.get_batch(buffer.sample(2, step=1))["groups"] == ["p1", "p3"]
    metrics = buffer.pop_metrics()
    # Async refill: k evicted groups cost k new prompts (sync over-provisions 2k and drains).
    assert metrics["replay/evicted_filter"] == 2 and metrics["replay/refill"] == 2
    assert replica.queued[-2:] == ["p4", "p5"] and buffer.loader.position == 6


@pytest.mark.parametrize("refill", [True, False])
def test_failed_groups_are_refilled_or_retried(refill: bool) -> None:
    buffer, tq, replica = make(ReplayConfig(refill_failed_groups=refill, prefetch_batches=0))
    buffer.dispatch(1, step=1)
    tq.set_tags("train", {"p0": {"status": "running"}})
    tq.set_tags("train", {"p0": {"status": "failure"}})
    buffer.cfg.sample_timeout_seconds = 0.05
    with pytest.raises(SampleTimeoutError):
        buffer.sample(1, step=1)
    metrics = buffer.pop_metrics()
    if refill:
        assert replica.queued == ["p0", "p1"] and metrics["replay/evicted_failure"] == 1
        assert tq.query("train", kind="prompt") == ["p1"]
    else:
        assert replica.queued == ["p0", "p0"] and metrics["replay/retried_failure"] == 1
        assert tq.get_tags("train", ["p0"])[0]["status"] == "pending"


def test_custom_sampler_is_loaded_by_import_path_and_name() -> None:
    assert load_sampler_class("rl_train.storage.replay_buffer_async:ReplayBufferAsync") is ReplayBufferAsync
    assert load_sampler_class("rl_train.storage.replay_buffer_async.ReplayBufferAsync") is ReplayBufferAsync
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_sampler_class("rl_train.storage.replay_buffer_async:Nope")


def test_starvation_rescue_generates_fresh_groups_on_the_spare_engine() -> None:
    buffer, tq, replica = make(ReplayConfig(prefetch_batches=0, rescue_after_seconds=0.05))
    buffer.dispatch(2, step=1)  # p0, p1 queued on a replica that never delivers (paused)
    rescued: list[list[str]] = []

    def spare_engine(keys: list[str]) -> None:
        rescued.append(keys)
        for key in keys:
            finish(tq, key, [[0], [0]])

    buffer.rescue = spare_engine
    batch = tq.get_batch(buffer.sample(2, step=1))
    assert rescued == [["p2", "p3"]] and batch["groups"] == ["p2", "p3"]
    assert replica.queued == ["p0", "p1"]  # rescue groups never go to the starved replica
    metrics = buffer.pop_metrics()
    assert metrics["replay/rescue_activations"] == 1 and metrics["replay/rescue_groups"] == 2
