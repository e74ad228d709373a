"""A rollout batch's bookkeeping (R-2.5): which trajectories a partial group still generates, when
a group may be written before the batch ends, and how each group is tagged at the end."""

from __future__ import annotations

from typing import Any

from rl_train.engines.agent.loop import AgentTrajectory
from rl_train.engines.workers.rollout_batch import RolloutBatch

PROMPT = {"prompt": "1+1=", "data_source": "arith", "ground_truth": "2"}


def trajectory(request_id: str, stop: str = "eos", versions: tuple[int, ...] = (3,)) -> AgentTrajectory:
    return AgentTrajectory(request_id, [1, 5], [6] * len(versions), token_versions=list(versions), stop_reason=stop)


def stored(stop: str, response: list[int], versions: list[int]) -> dict[str, Any]:
    return {"stop_reason": stop, "response_ids": response, "token_versions": versions}


def test_a_partial_group_generates_only_its_aborted_trajectories_and_a_single_turn_continues_them() -> None:
    batch = RolloutBatch("train", n=3, with_tools=False)
    batch.earlier = {"p/0": stored("eos", [7, 2], [1, 1]), "p/1": stored("aborted", [7, 8], [1, 1])}
    batch.earlier |= {"q/0": stored("aborted", [4], [2])}
    starts = batch.add_groups(["p", "q"], [PROMPT, PROMPT], ["single_turn", "tool_agent"], [[1, 5], [1, 6]])
    # p/0 ended before: kept. p/1 was aborted: continued from its tokens. p/2 was never stored: afresh.
    assert starts["single_turn"] == [("p/1", [1, 5], [7, 8]), ("p/2", [1, 5], [])]
    # a tool loop cannot tell its observations from its tokens: q/0 starts afresh too
    assert starts["tool_agent"] == [("q/0", [1, 6], []), ("q/1", [1, 6], []), ("q/2", [1, 6], [])]
    assert batch.groups["p"].expected == 2 and batch.groups["q"].expected == 3


def test_a_group_is_written_early_once_its_last_trajectory_ends_unaborted() -> None:
    batch = RolloutBatch("train", n=2, with_tools=False)
    batch.add_groups(["p", "q"], [PROMPT, PROMPT], ["tool_agent"] * 2, [[1], [1]])
    assert batch.unfinished_groups() == 2
    assert batch.end(trajectory("p/0")) is None  # one of two
    group = batch.end(trajectory("p/1"))
    assert group is batch.groups["p"] and [t.request_id for t in group.ended] == ["p/0", "p/1"]
    assert batch.end(trajectory("q/0", "aborted")) is None and batch.end(trajectory("q/1")) is None  # an abort: not done
    group.written = True
    batch.written_early.append("p")
    assert batch.unfinished_groups() == 0
    assert batch.early_keys() == ["p/0", "p/1"]


def test_with_tools_no_group_is_written_before_its_calls_return() -> None:
    batch = RolloutBatch("train", n=1, with_tools=True)
    batch.add_groups(["p"], [PROMPT], ["tool_agent"], [[1]])
    assert batch.end(trajectory("p/0")) is None


def test_the_final_tags_finish_done_groups_and_send_aborted_ones_back_with_their_oldest_version() -> None:
    batch = RolloutBatch("train", n=2, with_tools=False)
    batch.earlier = {"q/0": stored("eos", [4], [1])}
    batch.add_groups(["p", "q", "w"], [PROMPT] * 3, ["single_turn"] * 3, [[1]] * 3)
    batch.groups["w"].written = True  # written early: tagged then, not again
    records = {"p/0": {"token_versions": [3]}, "p/1": {"token_versions": [3]}, "q/1": {"token_versions": [2, 4]}}
    tags = {"p/0": {"status": "eos"}, "p/1": {"status": "length"}, "q/1": {"status": "aborted"}}
    unfinished, deadlines, status = batch.final_tags(records, tags)
    assert unfinished == ["q"] and deadlines == {}
    # q's oldest token: version 1, its stored q/0's, older than the aborted q/1's 2
    assert status == {"p": {"status": "finished", "partial": False}, "q": {"status": "pending", "partial": True, "version": 1}}


def test_with_tools_a_done_group_waits_for_its_last_call() -> None:
    batch = RolloutBatch("train", n=2, with_tools=True)
    batch.add_groups(["p"], [PROMPT], ["tool_agent"], [[1]])
    records = {"p/0": {"tool_done_at": 105.0, "token_versions": [0]}, "p/1": {"tool_done_at": 101.5, "token_versions": [0]}}
    unfinished, deadlines, status = batch.final_tags(records, {"p/0": {"status": "eos"}, "p/1": {"status": "eos"}})
    assert unfinished == [] and deadlines == {"p": 105.0} and status == {}  # still running until then


def test_a_failed_batch_tags_every_prompt_it_took_but_those_written() -> None:
    batch = RolloutBatch("train", n=1, with_tools=False)
    batch.taken = ["p", "q", "r"]  # r was taken in, its group never built (its agent loop was unknown)
    batch.add_groups(["p", "q"], [PROMPT] * 2, ["single_turn"] * 2, [[1]] * 2)
    batch.groups["p"].written = True
    assert batch.failed_keys(["p", "q", "s"]) == ["q", "s", "r"]
