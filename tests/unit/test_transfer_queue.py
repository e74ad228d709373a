"""TransferQueue tags, queries and batches; balancing; reward routing and placement."""

from __future__ import annotations

import pytest
import torch

from rl_train.algorithms.balance import partition_by_tokens
from rl_train.algorithms.reward_placement import place_on_last_token
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.router import RewardRouter
from rl_train.registry import UnknownNameError
from rl_train.storage.transfer_queue import TagTransitionError, TransferQueue


def test_prompt_status_follows_the_lifecycle() -> None:
    tq = TransferQueue()
    tq.put(
        "train",
        {"p0": {"prompt": "1+1="}, "p1": {"prompt": "2+2="}},
        {k: {"kind": "prompt", "status": "pending"} for k in ("p0", "p1")},
    )
    tq.set_tags("train", {"p0": {"status": "running"}})
    assert tq.query("train", kind="prompt", status="pending") == ["p1"]
    tq.set_tags("train", {"p0": {"status": "finished"}})
    with pytest.raises(TagTransitionError, match="from 'finished' to 'running'"):
        tq.set_tags("train", {"p0": {"status": "running"}})
    with pytest.raises(TagTransitionError, match="from 'pending' to 'finished'"):
        tq.set_tags("train", {"p1": {"status": "finished"}})
    tq.set_tags("train", {"p1": {"status": "running"}})
    tq.set_tags("train", {"p1": {"status": "failure"}})
    tq.set_tags("train", {"p1": {"status": "pending"}})  # a failed prompt can be re-dispatched
    assert tq.count("train", status="pending") == 1


def test_fields_batches_and_partitions() -> None:
    tq = TransferQueue()
    tq.put(
        "train",
        {"a/0": {"response_ids": [1, 2], "reward": 1.0}},
        {"a/0": {"kind": "trajectory", "version": 3}},
    )
    tq.put("train", {"a/0": {"advantages": [0.5, 0.5]}})
    assert tq.get("train", ["a/0"], ["reward", "advantages"]) == [{"reward": 1.0, "advantages": [0.5, 0.5]}]
    with pytest.raises(KeyError, match="lacks field"):
        tq.get("train", ["a/0"], ["old_log_probs"])
    # optional fields come back where the record has them, and are left out where it has not
    assert tq.get("train", ["a/0"], ["reward"], ["advantages", "is_infra"]) == [
        {"reward": 1.0, "advantages": [0.5, 0.5]}
    ]
    with pytest.raises(KeyError, match="unknown TransferQueue partition 'test'"):
        tq.get("test", ["a/0"])
    assert tq.query("train", version=3) == ["a/0"] and tq.query("val") == []
    tq.put_batch("b1", "train", ["a/0"], groups=["a"])
    tq.update_batch("b1", shards=[["a/0"]])
    assert tq.get_batch("b1")["shards"] == [["a/0"]]
    tq.drop_batch("b1")
    assert tq.stats()["tq/train_records"] == 0


def test_balance_evens_tokens_across_ranks() -> None:
    keys = [f"k{i}" for i in range(8)]
    lengths = [9, 1, 8, 2, 7, 3, 6, 4]
    shards = partition_by_tokens(keys, lengths, 2)
    loads = [sum(lengths[keys.index(k)] for k in s) for s in shards]
    assert sorted(k for s in shards for k in s) == sorted(keys)
    assert abs(loads[0] - loads[1]) <= 1


def test_reward_routing_by_data_source() -> None:
    router = RewardRouter()
    row = {"prompt": "3+4=", "data_source": "arith/single_digit_sum", "ground_truth": "7"}
    scores = router.score([Trajectory.of_answer(row, text) for text in (" 7 ", "8", "77")])
    assert [r.score for r in scores] == [1.0, 0.0, 0.0]
    with pytest.raises(UnknownNameError, match="no reward for data_source 'code/python'"):
        router.route("code/python")


def test_score_sits_on_the_last_graded_token() -> None:
    # row 0: graded tokens at 0..2 -> score on 2; row 1: a tool observation (mask 0) ends the row,
    # so the score goes on the last *graded* token, 1; row 2: nothing graded -> no reward.
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = place_on_last_token(torch.tensor([1.0, 0.5, 3.0]), mask)
    assert out.tolist() == [[0, 0, 1.0, 0], [0, 0.5, 0, 0], [0, 0, 0, 0]]
