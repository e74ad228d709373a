"""The DAPO filter's metric (``replay.filter_groups_metric``): the filter judges the reward or a
sub-score of it, through the sync replay buffer as a run drives it."""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.storage.dataset import PromptLoader
from rl_train.storage.group_scoring import groups_with_gradient
from rl_train.storage.handles import Done
from rl_train.storage.replay_buffer import ReplayBuffer
from rl_train.storage.replay_buffer_async import ReplayBufferAsync
from rl_train.storage.replay_config import ReplayConfig
from rl_train.storage.transfer_queue import TransferQueue

N = 2
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # the reward varies within the group (a format bonus), the exact rule does not: both wrong
    "reward_varies": [
        {"reward": 0.2, "reward_sub_scores": {"exact": 0.0, "format": 1.0}},
        {"reward": 0.0, "reward_sub_scores": {"exact": 0.0, "format": 0.0}},
    ],
    # the rule varies, the clipped reward does not (one right, one wrong with a bonus that caps out)
    "exact_varies": [
        {"reward": 1.0, "reward_sub_scores": {"exact": 1.0, "format": 1.0}},
        {"reward": 1.0, "reward_sub_scores": {"exact": 0.0, "format": 1.0}},
    ],
    # a reward without the sub-score
    "plain": [{"reward": 1.0}, {"reward": 0.0}],
    # one grader failed (no sub-scores written), the other sample's rule varies from... nothing
    "infra": [{"reward": 0.0, "is_infra": True}, {"reward": 1.0, "reward_sub_scores": {"exact": 1.0}}],
}


class ScriptedReplica:
    """The rollout edge: writes N scored trajectories per prompt, as the prompt text's script says."""

    def __init__(self, tq: TransferQueue) -> None:
        self.tq = tq

    def start_generating(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> Done[list[str]]:
        records = {}
        for key, prompt in zip(keys, self.tq.get(partition, keys), strict=True):
            for j, fields in enumerate(SCRIPTS[prompt["prompt"]]):
                records[f"{key}/{j}"] = {"group_id": key, **fields}
        self.tq.put(partition, records, {k: {"kind": "trajectory", "status": "eos"} for k in records})
        self.tq.set_tags(partition, {k: {"status": "running"} for k in keys})
        self.tq.set_tags(partition, {k: {"status": "finished"} for k in keys})
        return Done(list(records))


def make(kinds: list[str], **replay: Any) -> tuple[ReplayBuffer, TransferQueue]:
    """A buffer whose i-th drawn prompt is of kind ``kinds[i]`` (the loader shuffles: the rows are
    laid out in the order it draws them)."""
    order = [row["row"] for _, row in PromptLoader([{"row": i} for i in range(len(kinds))]).take(len(kinds))]
    prompts: list[dict[str, Any]] = [{}] * len(kinds)
    for position, index in enumerate(order):
        prompts[index] = {"prompt": kinds[position], "data_source": f"src/{kinds[position]}", "ground_truth": "0"}
    tq = TransferQueue()
    buffer = ReplayBuffer(tq, [ScriptedReplica(tq)], PromptLoader(prompts), N, {}, config=ReplayConfig(**replay))
    return buffer, tq


def kept(kinds: list[str], **replay: Any) -> list[str]:
    """The kinds of the groups one dispatch keeps, in its order: with one filter round, those
    with gradient, then those without filling the shortfall."""
    buffer, tq = make(kinds, filter_groups=True, max_filter_rounds=1, **replay)
    return [prompt["prompt"] for prompt in tq.get("train", buffer.dispatch(len(kinds), step=1))]


def test_by_default_the_filter_judges_the_reward() -> None:
    assert kept(["exact_varies", "reward_varies"]) == ["reward_varies", "exact_varies"]


def test_judging_a_sub_score_filters_the_group_whose_sub_score_agrees_and_keeps_the_reverse() -> None:
    assert kept(["reward_varies", "exact_varies"], filter_groups_metric="exact") == ["exact_varies", "reward_varies"]
    tq2 = TransferQueue()
    for kind, key in (("reward_varies", "a"), ("exact_varies", "b")):
        tq2.put("train", {key: {"prompt": kind}})
        tq2.put("train", {f"{key}/{j}": {"group_id": key, **f} for j, f in enumerate(SCRIPTS[kind])})
    assert groups_with_gradient(tq2, [], "train", ["a", "b"], N, "exact") == {"a": False, "b": True}
    assert groups_with_gradient(tq2, [], "train", ["a", "b"], N, "format") == {"a": True, "b": False}
    assert groups_with_gradient(tq2, [], "train", ["a", "b"], N) == {"a": True, "b": False}


class QueueingReplica:
    """An async-mode replica that only records what it was asked to generate (the test writes)."""

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        pass


def test_the_async_buffer_judges_the_same_metric() -> None:
    tq = TransferQueue()
    prompts = [{"prompt": f"q{i}", "data_source": "d", "ground_truth": "0"} for i in range(100)]
    config = ReplayConfig(filter_groups=True, filter_groups_metric="exact", prefetch_batches=1)
    buffer = ReplayBufferAsync(tq, [QueueingReplica()], PromptLoader(prompts), N, {}, config)
    buffer.dispatch(2, step=1)  # p0..p3 outstanding
    for group, kind in (("p0", "reward_varies"), ("p1", "exact_varies"), ("p2", "reward_varies"), ("p3", "exact_varies")):
        records = {f"{group}/{j}": {"group_id": group, "token_versions": [0], **f} for j, f in enumerate(SCRIPTS[kind])}
        tq.put("train", records, {k: {"kind": "trajectory", "status": "eos", "version": 0} for k in records})
        tq.set_tags("train", {group: {"status": "running"}})
        tq.set_tags("train", {group: {"status": "finished"}})
    assert tq.get_batch(buffer.sample(2, step=1))["groups"] == ["p1", "p3"]
    assert buffer.pop_metrics()["replay/evicted_filter"] == 2


def test_an_infra_sample_needs_no_sub_score_and_is_left_out() -> None:
    tq = TransferQueue()
    tq.put("train", {"g": {"prompt": "infra"}})
    tq.put("train", {f"g/{j}": {"group_id": "g", **f} for j, f in enumerate(SCRIPTS["infra"])})
    assert groups_with_gradient(tq, [], "train", ["g"], N, "exact") == {"g": False}  # one real score left


def test_a_sample_without_the_sub_score_fails_the_first_step_naming_metric_and_data_source() -> None:
    buffer, _ = make(["exact_varies", "plain"], filter_groups=True, filter_groups_metric="exact")
    with pytest.raises(ValueError, match=r"replay.filter_groups_metric: 'exact' is not a sub-score of trajectory 'p1/0' "
                       r"\(data_source 'src/plain'; its reward returned sub-scores: none\)"):
        buffer.dispatch(2, step=1)


def test_the_metric_is_checked_at_config_load() -> None:
    config = load_config(None, ["replay.filter_groups=true", "replay.filter_groups_metric=exact"])
    assert config.replay.filter_groups_metric == "exact"
    with pytest.raises(ConfigError, match=r"replay: filter_groups_metric: got 'exact' with filter_groups false"):
        load_config(None, ["replay.filter_groups_metric=exact"])
    with pytest.raises(ConfigError, match=r"replay.filter_groups_metric: got ''"):
        load_config(None, ["replay.filter_groups=true", "replay.filter_groups_metric="])
