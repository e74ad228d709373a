"""The phases that run inside the queue actor, driven as a plain object (no Ray)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rl_train.config import Config
from rl_train.engines.workers.queue_worker import QueueWorker
from rl_train.engines.workers.ranked_pool import mean_over_ranks


def _queue(**algorithm: Any) -> QueueWorker:
    return QueueWorker(Config.model_validate({"algorithm": algorithm}).model_dump(mode="json"))


def _put_group(q: QueueWorker, group: str, rewards: list[float], lengths: list[int]) -> list[str]:
    keys = [f"{group}/{j}" for j in range(len(rewards))]
    records = {
        k: {
            "group_id": group,
            "reward": r,
            "prompt_ids": [1, 2],
            "response_ids": list(range(n)),
            "old_log_probs": [-1.0] * n,
            "rollout_log_probs": [-0.5] * n,
        }
        for k, r, n in zip(keys, rewards, lengths, strict=True)
    }
    tags = {k: {"kind": "trajectory", "prompt_len": 2, "response_len": n} for k, n in zip(keys, lengths, strict=True)}
    q.put("train", records, tags)
    return keys


def test_advantages_are_computed_and_written_where_the_records_are() -> None:
    q = _queue()
    keys = _put_group(q, "g", [1.0, 0.0], [3, 1])
    q.put_batch("b", "train", keys, groups=["g"])
    metrics = q.compute_advantages("b")
    # Group g: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5 / sqrt(0.5).
    a = 0.5 / math.sqrt(0.5)
    stored = q.get("train", keys, ["advantages"])
    assert stored[0]["advantages"] == pytest.approx([a] * 3, rel=1e-5)
    assert stored[1]["advantages"] == pytest.approx([-a], rel=1e-5)
    assert metrics["advantage/mean"] == pytest.approx((3 * a - a) / 4, rel=1e-5)
    assert q.run_config()["algorithm"]["adv_estimator"] == "grpo"


def test_bypass_copies_the_rollout_log_probs_as_pi_old() -> None:
    q = _queue()
    keys = _put_group(q, "g", [1.0, 0.0], [2, 1])
    q.put_batch("b", "train", keys, groups=["g"])
    q.copy_rollout_log_probs("b")
    assert [r["old_log_probs"] for r in q.get("train", keys)] == [[-0.5, -0.5], [-0.5]]


def test_current_version_copies_only_what_pi_olds_weights_sampled() -> None:
    """Step 3 trains from version 2 (pi_old: the weights local update 0 starts from). Only a
    trajectory whose every token version 2 sampled is copied; a mixed one, an off-version one and
    one whose versions do not cover its response are recomputed, and leave the shards as they were."""
    q = _queue()
    keys = _put_group(q, "g", [1.0, 0.0, 1.0, 0.0], [2, 2, 2, 2])
    q.put(
        "train",
        {
            "g/0": {"token_versions": [2, 2], "rollout_log_probs": [-0.25, -0.75]},
            "g/1": {"token_versions": [1, 2]},
            "g/2": {"token_versions": [2, 2], "off_version": True},
            "g/3": {"token_versions": [2]},
        },
    )
    for key in keys:  # the recompute would write these: none yet
        q.put("train", {key: {"old_log_probs": None}})
    q.put_batch("b", "train", keys, groups=["g"], step=3, shards=[["g/0", "g/1"], ["g/2", "g/3"]])
    shards, metrics = q.copy_current_log_probs("b")
    assert shards == [["g/1"], ["g/2", "g/3"]]
    assert metrics == {"rollout_corr/old_log_probs_copied": 0.25}
    assert [r["old_log_probs"] for r in q.get("train", keys)] == [[-0.25, -0.75], None, None, None]


def test_balance_spreads_tokens_and_reports_the_heaviest_rank() -> None:
    q = _queue()
    # Lengths (prompt 2 + response): 12, 7, 6, 5 -> longest first: 12 -> r0, 7 -> r1, 6 -> r1 (13),
    # 5 -> r0 (17). Heaviest rank: 17 tokens.
    keys = _put_group(q, "g", [0.0] * 4, [10, 5, 4, 3])
    q.put_batch("b", "train", keys, groups=["g"])
    metrics = q.balance_batch("b", 2)
    assert q.get_batch("b")["shards"] == [["g/0", "g/3"], ["g/1", "g/2"]]
    assert metrics["balance/max_rank_tokens"] == 17.0
    assert metrics["response_length/mean"] == pytest.approx(22 / 4)


def test_update_metrics_are_the_mean_over_ranks_not_rank_zeros() -> None:
    per_rank = [{"actor/loss": 1.0, "actor/grad_norm": 2.0}, {"actor/loss": 3.0, "actor/grad_norm": 2.0}]
    assert mean_over_ranks(per_rank) == {"actor/grad_norm": 2.0, "actor/loss": 2.0}
    assert mean_over_ranks([{"a": 1.0}, {}]) == {"a": 1.0}  # a rank without the key does not dilute it


@pytest.mark.parametrize("built_first", [False, True])
def test_a_restored_advantage_state_lands_whether_or_not_the_phase_is_built(
    tmp_path: Any, built_first: bool
) -> None:
    """A resume reads the advantage state before the phase (which imports torch) is built:
    it is kept and applied once the phase exists, or applied at once when it already does."""
    from rl_train.storage.checkpoint import CheckpointStore

    saved = _queue(kl_in_reward=True, kl_ctrl={"type": "adaptive", "kl_coef": 0.3})
    saved._advantage.kl_controller.value = 0.123  # a state the controller reached
    store = CheckpointStore(str(tmp_path))
    parts = saved.save_checkpoint(str(tmp_path), 1, None)
    store.commit(1, parts, {})
    fresh = _queue(kl_in_reward=True, kl_ctrl={"type": "adaptive", "kl_coef": 0.3})
    if built_first:
        fresh.warm_up()
        assert fresh._advantage.kl_controller.value == pytest.approx(0.3)
    fresh.load_checkpoint(str(tmp_path), 1, None, version=1)
    assert fresh._advantage.kl_controller.value == pytest.approx(0.123)
