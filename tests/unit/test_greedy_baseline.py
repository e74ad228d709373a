"""ReMax's greedy baseline inside the queue actor (engines/workers/queue_worker.py), without Ray.

The pool stages the batch's prompts, the rollout pool answers them greedily into the greedy
partition and the reward pool scores them there (simulated here by writing the answers'
records); the queue then gives each trajectory its prompt's greedy reward and forgets the
greedy answers, which never join a batch.
"""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.config import Config
from rl_train.engines.workers.queue_worker import GREEDY_PARTITION, QueueWorker


def queue_with_batch(estimator: str) -> QueueWorker:
    """Prompts p0, p1 with two sampled trajectories each, in batch "b"."""
    tq = QueueWorker(
        Config.model_validate({"algorithm": {"adv_estimator": estimator}}).model_dump(mode="json")
    )
    prompts = {
        g: {"prompt": f"{i}+1=", "data_source": "arith", "ground_truth": str(i + 1)}
        for i, g in enumerate(["p0", "p1"])
    }
    tq.put("train", prompts, {g: {"kind": "prompt", "status": "pending"} for g in prompts})
    rewards = {"p0/0": 1.0, "p0/1": 0.0, "p1/0": 0.0, "p1/1": 0.0}
    trajectories: dict[str, dict[str, Any]] = {
        key: {
            "group_id": key.split("/")[0],
            "prompt_ids": [1, 2],
            "response_ids": [3, 4],
            "rollout_log_probs": [-1.0, -1.0],
            "old_log_probs": [-1.0, -1.0],
            "reward": reward,
        }
        for key, reward in rewards.items()
    }
    tq.put(
        "train",
        trajectories,
        {k: {"kind": "trajectory", "group_id": r["group_id"]} for k, r in trajectories.items()},
    )
    tq.put_batch("b", "train", list(trajectories), groups=["p0", "p1"], step=1)
    return tq


def answer_greedily(tq: QueueWorker, prompts: list[str], greedy_rewards: dict[str, float]) -> list[str]:
    """What the rollout and reward pools do to the staged prompts: one scored answer each."""
    answers = {f"{g}/0": {"group_id": g, "response_ids": [5], "reward": greedy_rewards[g]} for g in prompts}
    tq.put(GREEDY_PARTITION, answers)
    return list(answers)


def test_each_trajectory_gets_its_prompts_greedy_reward_and_the_answers_leave() -> None:
    tq = queue_with_batch("remax")
    staged = tq.stage_greedy_prompts("b")
    assert staged == ["p0", "p1"]
    assert tq.get(GREEDY_PARTITION, staged) == tq.get("train", staged)  # the same prompts
    assert tq.query(GREEDY_PARTITION, kind="prompt", status="pending") == staged

    metrics = tq.set_baseline_rewards("b", answer_greedily(tq, staged, {"p0": 1.0, "p1": 0.0}))
    assert metrics == {"greedy_baseline/reward_mean": 0.5}
    baselines = [r["baseline_reward"] for r in tq.get("train", ["p0/0", "p0/1", "p1/0", "p1/1"])]
    assert baselines == [1.0, 1.0, 0.0, 0.0]
    assert tq.stats()["tq/greedy_records"] == 0  # prompts and answers gone
    assert tq.get_batch("b")["keys"] == ["p0/0", "p0/1", "p1/0", "p1/1"]  # never trained on


def test_remax_advantages_in_the_queue_actor_use_the_greedy_baseline() -> None:
    # p0's greedy answer is right (baseline 1): its right sample gets 0, its wrong one -1.
    # p1's greedy answer is wrong (baseline 0): both wrong samples get 0.
    tq = queue_with_batch("remax")
    tq.set_baseline_rewards("b", answer_greedily(tq, tq.stage_greedy_prompts("b"), {"p0": 1.0, "p1": 0.0}))
    tq.compute_advantages("b")
    advantages = [r["advantages"] for r in tq.get("train", ["p0/0", "p0/1", "p1/0", "p1/1"])]
    assert advantages == [pytest.approx([0.0, 0.0]), pytest.approx([-1.0, -1.0]), [0.0, 0.0], [0.0, 0.0]]


def test_a_prompt_without_a_scored_greedy_answer_fails_loudly() -> None:
    tq = queue_with_batch("remax")
    staged = tq.stage_greedy_prompts("b")
    with pytest.raises(KeyError, match=r"no greedy answer was scored for prompt\(s\) \['p1'\]"):
        tq.set_baseline_rewards("b", answer_greedily(tq, staged[:1], {"p0": 1.0}))


def test_a_greedy_answer_without_a_verdict_leaves_its_prompts_trajectories_out() -> None:
    # p1's greedy answer is infra: no baseline, so p1's samples are marked is_infra (no advantage)
    # instead of being measured against a placeholder 0; p0 trains as before.
    tq = queue_with_batch("remax")
    greedy = answer_greedily(tq, tq.stage_greedy_prompts("b"), {"p0": 1.0, "p1": 0.0})
    tq.put(GREEDY_PARTITION, {"p1/0": {"is_infra": True}})
    metrics = tq.set_baseline_rewards("b", greedy)
    assert metrics == {"greedy_baseline/reward_mean": 1.0, "greedy_baseline/infra": 1.0}
    records = tq.get("train", ["p0/0", "p1/0", "p1/1"], ["baseline_reward"], ["is_infra"])
    assert records == [{"baseline_reward": 1.0}] + [{"baseline_reward": 0.0, "is_infra": True}] * 2
    assert tq.stats()["tq/greedy_records"] == 0
    tq.compute_advantages("b")
    advantages = [r["advantages"] for r in tq.get("train", ["p0/0", "p0/1", "p1/0", "p1/1"])]
    assert advantages == [pytest.approx([0.0, 0.0]), pytest.approx([-1.0, -1.0]), [0.0, 0.0], [0.0, 0.0]]
    masks = [r["response_mask"] for r in tq.get("train", ["p0/0", "p0/1", "p1/0", "p1/1"], ["response_mask"])]
    assert masks == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]  # p1 trains no token
