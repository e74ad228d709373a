"""The sync replay buffer's DAPO filter (R-7.3): evict k, refill 2k, drain, discard the surplus."""

from __future__ import annotations

from typing import Any

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.handles import Done
from rl_train.storage.replay_buffer import ReplayBuffer
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2


class ScriptedReplica:
    """The rollout edge: writes N trajectories per prompt whose scores the prompt text dictates
    ("mixed" -> one right, one wrong: gradient; "same" -> both right: no gradient)."""

    def __init__(self, tq: TransferQueue) -> None:
        self.tq = tq
        self.calls: list[list[str]] = []

    def generate_prompts(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        self.calls.append(list(keys))
        records, tags = {}, {}
        for key, prompt in zip(keys, self.tq.get(partition, keys), strict=True):
            rewards = [1.0, 0.0] if prompt["prompt"] == "mixed" else [1.0, 1.0]
            for j in range(n):
                records[f"{key}/{j}"] = {"group_id": key, "reward": rewards[j]}
                tags[f"{key}/{j}"] = {"kind": "trajectory", "status": "eos", "group_id": key}
        self.tq.put(partition, records, tags)
        self.tq.set_tags(partition, {k: {"status": "running"} for k in keys})
        self.tq.set_tags(partition, {k: {"status": "finished"} for k in keys})
        return list(records)

    def start_generating(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> Done[list[str]]:
        return Done(self.generate_prompts(partition, keys, n, params))


def make(kinds: list[str], **replay: Any) -> tuple[ReplayBuffer, TransferQueue, ScriptedReplica, list[str]]:
    """A buffer whose i-th drawn prompt is of kind ``kinds[i]``; also returns the drawn keys in order."""
    probe = PromptLoader([{"row": i} for i in range(len(kinds))])
    order = [row["row"] for _, row in probe.take(len(kinds))]  # dataset row drawn at each position
    prompts: list[dict[str, Any]] = [{}] * len(kinds)
    for position, index in enumerate(order):
        prompts[index] = {"prompt": kinds[position], "data_source": "d", "ground_truth": "0"}
    tq = TransferQueue()
    replica = ScriptedReplica(tq)
    buffer = ReplayBuffer(tq, [replica], PromptLoader(prompts), N, {}, config=ReplayConfig(**replay))
    return buffer, tq, replica, [f"p{position}" for position in range(len(kinds))]


def test_filter_evicts_k_refills_2k_then_drains_and_discards_the_surplus() -> None:
    # Round 1: p0..p3 -> p1 and p3 have no gradient (k = 2): evicted, 2k = 4 refills p4..p7.
    # Round 2: p4, p5, p6 have gradient: 2 + 3 = 5 >= 4 ready -> dispatch stops (draining).
    kinds = ["mixed", "same", "mixed", "same", "mixed", "mixed", "mixed", "same", "mixed"]
    buffer, tq, replica, p = make(kinds, filter_groups=True)
    buffer.dispatch(4, step=1)
    assert replica.calls == [p[0:4], p[4:8]]
    assert tq.count("train", group_id=p[1]) == 0 and tq.count("train", group_id=p[7]) == 0
    batch = tq.get_batch(buffer.sample(4, step=1))
    assert batch["groups"] == [p[0], p[2], p[4], p[5]]  # oldest first
    assert tq.query("train", kind="prompt") == [p[0], p[2], p[4], p[5]]  # p6: surplus, discarded
    assert buffer.loader.position == 8
    assert buffer.pop_metrics() == {
        "replay/evicted_filter": 3.0,  # p1, p3, then p7
        "replay/refill": 4.0,  # 2 x 2 after round 1; none after round 2 (drained)
        "replay/discarded_surplus": 1.0,
        "replay/filter_shortfall": 0.0,
        "replay/evicted_failure": 0.0,
        "replay/retried_failure": 0.0,
        "rollout/generation_errors": 0.0,
        "rollout/revived_replicas": 0.0,
    }


def test_filter_fills_with_no_gradient_groups_after_the_last_round() -> None:
    buffer, tq, replica, p = make(
        ["mixed", "same", "same", "same"] * 5, filter_groups=True, max_filter_rounds=2
    )
    buffer.dispatch(2, step=1)
    # Round 1: p0 ok, p1 evicted -> refill p2, p3 (round 2, the last): both without gradient,
    # one of them fills the batch, the other is evicted.
    assert replica.calls == [p[0:2], p[2:4]]
    assert tq.get_batch(buffer.sample(2, step=1))["groups"] == [p[0], p[2]]
    metrics = buffer.pop_metrics()
    assert metrics["replay/filter_shortfall"] == 1 and metrics["replay/evicted_filter"] == 2


def test_without_the_filter_every_group_is_kept() -> None:
    buffer, tq, _, p = make(["same"] * 4)
    assert buffer.dispatch(2, step=1) == p[0:2]
    assert tq.get_batch(buffer.sample(2, step=1))["groups"] == p[0:2]
    assert set(buffer.pop_metrics().values()) == {0.0}


def test_a_prefetched_round_is_what_the_next_dispatch_collects() -> None:
    buffer, tq, replica, p = make(["mixed"] * 6)
    buffer.prefetch(2, step=2)  # right after step 1's weight sync
    assert replica.calls == [p[0:2]]  # started at once (a plain replica runs right away)
    buffer.dispatch(2, step=2)
    assert replica.calls == [p[0:2]]  # nothing generated twice
    assert tq.get_batch(buffer.sample(2, step=2))["groups"] == [p[0], p[1]]
    assert [t["step"] for t in tq.get_tags("train", [p[0], p[1]])] == [2, 2]  # drawn for step 2


def test_a_prefetch_for_other_groups_is_kept_not_lost_or_repeated() -> None:
    buffer, tq, replica, p = make(["mixed"] * 8)
    buffer.prefetch(2, step=2)
    buffer.dispatch(3, step=2)  # another size: the prefetched groups finish and wait their turn
    assert replica.calls == [p[0:2], p[2:5]]
    assert tq.get_batch(buffer.sample(3, step=2))["groups"] == [p[0], p[1], p[2]]  # oldest first
    assert tq.query("train", kind="prompt", status="finished") == [p[0], p[1], p[2], p[3], p[4]]
    assert buffer.loader.position == 5  # every prompt drawn once


class UnscoredReplica(ScriptedReplica):
    """Writes the trajectories unscored, as a real rollout replica does."""

    def generate_prompts(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> list[str]:
        self.calls.append(list(keys))
        records = {f"{k}/{j}": {"group_id": k} for k in keys for j in range(n)}
        tags = {f"{k}/{j}": {"kind": "trajectory", "status": "eos", "group_id": k} for k in keys for j in range(n)}
        self.tq.put(partition, records, tags)
        self.tq.set_tags(partition, {k: {"status": "running"} for k in keys})
        self.tq.set_tags(partition, {k: {"status": "finished"} for k in keys})
        return list(records)


class InfraScorer:
    """The reward edge: scores 1 and 0 in each group, but marks both trajectories of an "infra"
    prompt's group is_infra (its grader failed, R-6.5), and one of a "half" prompt's."""

    def __init__(self, tq: TransferQueue) -> None:
        self.tq = tq
        self.calls = 0

    def score(self, partition: str, keys: list[str]) -> list[object]:
        self.calls += 1
        groups = {key.rsplit("/", 1)[0] for key in keys}
        kinds = {g: self.tq.get(partition, [g])[0]["prompt"] for g in groups}
        fields = {}
        for key in keys:
            kind, j = kinds[key.rsplit("/", 1)[0]], int(key.rsplit("/", 1)[1])
            infra = kind == "infra" or (kind == "half" and j == 0)
            fields[key] = {"reward": 0.0 if infra else float(j % 2), "is_infra": infra}
        self.tq.put(partition, fields)
        return []


def test_groups_short_of_real_scores_are_refilled_like_failed_groups() -> None:
    # Round 1: p0 (mixed, 2 real), p1 (infra, 0 real), p2 (half, 1 real) -> p1, p2 evicted, 2 fresh
    # prompts p3, p4 (1 each, like a failed group). Round 2: p3 infra again, p4 mixed -> p3 evicted,
    # p5 drawn. Round 3 (the last, max_filter_rounds=3): p5 infra -> kept, counted as a shortfall.
    kinds = ["mixed", "infra", "half", "infra", "mixed", "infra", "mixed"]
    buffer, tq, _, p = make(kinds, refill_infra_groups=True, max_filter_rounds=3)
    replica = UnscoredReplica(tq)
    buffer.rollouts = [replica]
    scorer = buffer.rewards = [InfraScorer(tq)]
    ready = buffer.dispatch(3, step=1)
    assert replica.calls == [p[0:3], p[3:5], p[5:6]]
    assert ready == [p[0], p[4], p[5]] and tq.count("train", group_id=p[1]) == 0
    assert scorer[0].calls == 3  # scored in each round, before the reward phase
    metrics = buffer.pop_metrics()
    assert (metrics["replay/evicted_infra"], metrics["replay/refill"], metrics["replay/infra_shortfall"]) == (3, 3, 1)


def test_only_the_sync_buffer_refills_infra_groups() -> None:
    import pytest

    from rl_train.config import ConfigError, load_config

    assert load_config(None, ["replay.refill_infra_groups=true"]).replay.refill_infra_groups
    with pytest.raises(ConfigError, match="replay.refill_infra_groups: got true; only the sync mode"):
        load_config(None, ["trainer.mode=colocate_async", "replay.refill_infra_groups=true"])
