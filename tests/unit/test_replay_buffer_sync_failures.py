"""The sync replay buffer survives rollout failures: failed groups are retried or refilled per
``replay.refill_failed_groups`` and counted; a replica that keeps failing stops the run after
``replay.max_failure_rounds`` rounds in a row with a message that says why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.handles import Done, Pending
from rl_train.storage.replay_buffer import ReplayBuffer, RolloutFailedError, describe_error
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2


class FlakyReplica:
    """The rollout edge, failing as the real worker does: the prompts go ``running``, part of
    the output may be written, then the prompts are tagged ``failure`` and the call raises."""

    def __init__(
        self, tq: TransferQueue, fail_on_calls: set[int] | None = None, always: bool = False
    ) -> None:
        self.tq, self.fail_on_calls, self.always = tq, fail_on_calls or set(), always
        self.calls: list[list[str]] = []

    def generate_prompts(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        self.calls.append(list(keys))
        failing = self.always or len(self.calls) in self.fail_on_calls
        self.tq.set_tags(partition, {k: {"status": "running"} for k in keys})
        records, tags = {}, {}
        for key in keys:
            for j in range(n):
                records[f"{key}/{j}"] = {"group_id": key, "attempt": len(self.calls)}
                if failing:
                    records[f"{key}/{j}"]["half_written"] = True
                tags[f"{key}/{j}"] = {"kind": "trajectory", "status": "eos", "group_id": key}
        self.tq.put(partition, records, tags)
        if failing:
            self.tq.set_tags(partition, {k: {"status": "failure"} for k in keys})
            raise RuntimeError(f"engine fell over on call {len(self.calls)}")
        self.tq.set_tags(partition, {k: {"status": "finished"} for k in keys})
        return list(records)

    def start_generating(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> Pending[list[str]]:
        """In process: the round runs, and raises, right here."""
        return Done(self.generate_prompts(partition, keys, n, params))


class Deferred:
    """A call that runs when it is awaited, as a Ray actor's error shows only at ``ray.get``."""

    def __init__(self, run: Callable[[], list[str]]) -> None:
        self.run = run

    def wait(self) -> list[str]:
        return self.run()


class RemoteLikeReplica(FlakyReplica):
    """A replica whose failure surfaces when its call is awaited, not when it is started."""

    def start_generating(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> Pending[list[str]]:
        return Deferred(lambda: self.generate_prompts(partition, keys, n, params))


def make(
    replicas: int = 1, fail_on_calls: tuple[set[int], ...] = (), **replay: Any
) -> tuple[ReplayBuffer, TransferQueue, list[FlakyReplica]]:
    tq = TransferQueue()
    pool = [FlakyReplica(tq, fail_on_calls[i] if i < len(fail_on_calls) else None) for i in range(replicas)]
    prompts = [{"prompt": f"q{i}", "data_source": "d", "ground_truth": "0"} for i in range(50)]
    buffer = ReplayBuffer(tq, pool, PromptLoader(prompts), N, {}, config=ReplayConfig(**replay))
    return buffer, tq, pool


def _failure_metrics(buffer: ReplayBuffer) -> dict[str, float]:
    metrics = buffer.pop_metrics()
    names = ("replay/evicted_failure", "replay/retried_failure", "replay/refill", "rollout/generation_errors")
    return {name: metrics[name] for name in names}


def test_failed_groups_are_retried_as_they_are_by_default() -> None:
    buffer, tq, (replica,) = make(fail_on_calls=({1},))
    assert buffer.dispatch(2, step=1) == ["p0", "p1"]
    assert replica.calls == [["p0", "p1"], ["p0", "p1"]]  # the same prompts, once more
    assert buffer.loader.position == 2  # no fresh prompt drawn
    batch = tq.get_batch(buffer.sample(2, step=1))
    assert batch["groups"] == ["p0", "p1"]
    for record in tq.get("train", batch["keys"]):  # the failed attempt's output was dropped
        assert record["attempt"] == 2 and "half_written" not in record
    assert _failure_metrics(buffer) == {
        "replay/evicted_failure": 0.0,
        "replay/retried_failure": 2.0,
        "replay/refill": 0.0,
        "rollout/generation_errors": 1.0,
    }


def test_failed_groups_are_evicted_and_refilled_with_fresh_prompts() -> None:
    buffer, tq, (replica,) = make(fail_on_calls=({1},), refill_failed_groups=True)
    assert buffer.dispatch(2, step=1) == ["p2", "p3"]
    assert replica.calls == [["p0", "p1"], ["p2", "p3"]]
    assert tq.count("train", group_id="p0") == 0 and tq.query("train", kind="prompt") == ["p2", "p3"]
    assert tq.get_batch(buffer.sample(2, step=1))["groups"] == ["p2", "p3"]
    assert _failure_metrics(buffer) == {
        "replay/evicted_failure": 2.0,
        "replay/retried_failure": 0.0,
        "replay/refill": 2.0,  # one fresh prompt per evicted group
        "rollout/generation_errors": 1.0,
    }
    assert _failure_metrics(buffer)["rollout/generation_errors"] == 0.0  # popped: counted once


def test_only_the_failing_replicas_groups_are_generated_again() -> None:
    buffer, tq, (ok, flaky) = make(replicas=2, fail_on_calls=(set(), {1}))
    assert sorted(buffer.dispatch(4, step=1)) == ["p0", "p1", "p2", "p3"]
    assert ok.calls == [["p0", "p2"], ["p1"]] and flaky.calls == [["p1", "p3"], ["p3"]]
    assert tq.get("train", ["p0/0"])[0]["attempt"] == 1  # the healthy replica's output is kept
    assert _failure_metrics(buffer)["replay/retried_failure"] == 2.0


def test_a_failure_that_shows_when_the_call_is_awaited_is_handled_alike() -> None:
    # As with Ray actors: both replicas start, the second one's error surfaces at wait(); the
    # first one's output is kept and only the second one's groups are generated again.
    buffer, tq, (ok, flaky) = make(replicas=2, fail_on_calls=(set(), {1}))
    remote_like = [RemoteLikeReplica(tq, r.fail_on_calls) for r in (ok, flaky)]
    buffer.rollouts = remote_like
    assert sorted(buffer.dispatch(4, step=1)) == ["p0", "p1", "p2", "p3"]
    assert remote_like[0].calls == [["p0", "p2"], ["p1"]] and remote_like[1].calls == [["p1", "p3"], ["p3"]]
    assert tq.get("train", ["p0/0"])[0]["attempt"] == 1
    metrics = _failure_metrics(buffer)
    assert metrics["replay/retried_failure"] == 2.0 and metrics["rollout/generation_errors"] == 1.0


def test_a_broken_replica_stops_the_run_after_max_failure_rounds_in_a_row() -> None:
    buffer, tq, (replica,) = make(max_failure_rounds=2)
    replica.always = True
    with pytest.raises(RolloutFailedError) as info:
        buffer.dispatch(2, step=1)
    message = str(info.value)
    assert message.startswith("rollout failed 2 generation rounds in a row (replay.max_failure_rounds = 2)")
    assert "2 of 2 groups failed" in message
    assert "First error: RuntimeError: engine fell over on call 2" in message  # the last round's
    assert len(replica.calls) == 2  # bounded: no third round


def test_a_recovered_round_resets_the_count_of_rounds_in_a_row() -> None:
    # Step 1 fails once, step 2 fails once: neither reaches the limit of 2 rounds in a row.
    buffer, tq, (replica,) = make(fail_on_calls=({1, 3},), max_failure_rounds=2)
    for step in (1, 2):
        buffer.dispatch(1, step=step)
        buffer.release(buffer.sample(1, step=step))
    assert len(replica.calls) == 4
    assert _failure_metrics(buffer)["rollout/generation_errors"] == 2.0


def test_a_replica_that_leaves_its_prompts_unfinished_without_raising_counts_as_failed() -> None:
    buffer, tq, (replica,) = make(refill_failed_groups=True)
    calls = []

    def forgetful(partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        calls.append(list(keys))
        if len(calls) == 1:
            return []  # e.g. a replica restarted under the call: the prompts stay pending
        return FlakyReplica.generate_prompts(replica, partition, keys, n, params)

    replica.generate_prompts = forgetful  # type: ignore[method-assign]
    assert buffer.dispatch(1, step=1) == ["p1"]
    metrics = _failure_metrics(buffer)
    assert metrics["replay/evicted_failure"] == 1.0 and metrics["rollout/generation_errors"] == 0.0


def test_describe_error_keeps_the_cause_line_of_a_remote_traceback() -> None:
    remote = RuntimeError(
        "ray::RolloutWorker.generate_prompts()\n  File 'x.py', line 3\nValueError: prompt too long"
    )
    assert describe_error(remote) == "ValueError: prompt too long"
    assert describe_error(KeyError("p0")) == "KeyError: 'p0'"
