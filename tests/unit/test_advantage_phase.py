"""The advantage phase's pure part (rl_train/algorithms/advantage_phase.py) on hand-made TransferQueue records."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch

from rl_train.algorithms.advantage_phase import (
    AdvantagePhase,
    bypass_old_log_probs,
    pad_response,
    unpad_response,
)
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.algorithms.rollout_correction import MissingRolloutLogProbsError

LN = math.log


def record(group: str, reward: float, old: list[float], rollout: list[float] | None = None, **extra: Any):
    """A trajectory record as the earlier phases leave it: response-only per-token lists."""
    out = {"group_id": group, "reward": reward, "response_ids": list(range(len(old))), "old_log_probs": old}
    out["rollout_log_probs"] = old if rollout is None else rollout
    return {**out, **extra}


def phase(**algorithm: Any) -> AdvantagePhase:
    return AdvantagePhase.from_config(AlgorithmConfig.model_validate(algorithm))


def test_default_grpo_matches_hand_computed_and_writes_only_advantages() -> None:
    # Group g: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5 / sqrt(0.5) = +-0.7071.
    # Group h: one sample -> A = 0. Old == rollout, so every rollout_corr divergence is 0.
    records = [
        record("g", 1.0, [-1.0, -2.0, -0.5]),
        record("g", 0.0, [-0.3]),
        record("h", 1.0, [-0.1, -0.2]),
    ]
    updates, metrics = phase().compute(records)
    assert [sorted(u) for u in updates] == [["advantages"]] * 3
    a = 0.5 / math.sqrt(0.5)
    assert updates[0]["advantages"] == pytest.approx([a] * 3, rel=1e-5)
    assert updates[1]["advantages"] == pytest.approx([-a], rel=1e-5)
    assert updates[2]["advantages"] == [0.0, 0.0]
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    # 3 graded tokens at +a, 1 at -a, 2 at 0 -> mean 2a / 6 over the 6 response tokens.
    assert metrics["advantage/mean"] == pytest.approx(2 * a / 6, rel=1e-5)


def test_token_is_writes_truncated_weights() -> None:
    # token_is: w = exp(old - rollout), truncated above at 2: ratios 1.5 -> 1.5, 3 -> 2, 0.5 -> 0.5.
    records = [
        record("g", 1.0, [LN(0.3), LN(0.6)], [LN(0.2), LN(0.2)]),
        record("g", 0.0, [LN(0.1)], [LN(0.2)]),
    ]
    updates, metrics = phase(rollout_correction={"preset": "token_is"}).compute(records)
    assert updates[0]["rollout_is_weights"] == pytest.approx([1.5, 2.0], rel=1e-5)
    assert updates[1]["rollout_is_weights"] == pytest.approx([0.5], rel=1e-5)
    assert "response_mask" not in updates[0]  # IS alone leaves the mask alone
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0, rel=1e-5)
    # k1 kl = mean over tokens of -(old - rollout) = -(ln 1.5 + ln 3 + ln 0.5) / 3.
    assert metrics["rollout_corr/kl"] == pytest.approx(-(LN(1.5) + LN(3) + LN(0.5)) / 3, rel=1e-5)


def test_sequence_rs_zeroes_the_rejected_sample_but_keeps_it_in_the_baseline() -> None:
    # seq_mean_k3 <= 0.01: sample 0 has lr = ln 2 on both tokens, k3 = 2 - 1 - ln 2 = 0.307 -> rejected.
    # Group rewards 1, 0, 0 still give the baseline: mean 1/3, unbiased std sqrt(1/3);
    # the kept samples get (0 - 1/3) / sqrt(1/3) = -0.5774, the rejected one 0 instead of +1.1547.
    records = [
        record("g", 1.0, [LN(0.4), LN(0.4)], [LN(0.2), LN(0.2)]),
        record("g", 0.0, [-1.0]),
        record("g", 0.0, [-2.0, -1.0]),
    ]
    updates, metrics = phase(rollout_correction={"preset": "k3_rs"}).compute(records)
    assert updates[0]["response_mask"] == [0.0, 0.0]
    assert updates[1]["response_mask"] == [1.0] and updates[2]["response_mask"] == [1.0, 1.0]
    assert updates[0]["advantages"] == [0.0, 0.0]
    kept = -(1 / 3) / math.sqrt(1 / 3)
    assert updates[1]["advantages"] == pytest.approx([kept], rel=1e-5)
    assert updates[2]["advantages"] == pytest.approx([kept, kept], rel=1e-5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


def test_rs_starts_from_the_records_own_mask_and_only_removes_tokens() -> None:
    # token_k1 with u = 1.5 keeps ratios in [2/3, 1.5]: ratio 3 is rejected; the tool token
    # (mask 0 in the record) stays out whatever its ratio. No IS is configured, so no weights.
    records = [
        record("g", 1.0, [LN(0.6), LN(0.2), LN(0.9)], [LN(0.2), LN(0.2), LN(0.1)], response_mask=[1, 1, 0]),
        record("g", 0.0, [-1.0, -1.0]),
    ]
    cfg = {"rollout_rs": "token_k1", "rollout_rs_threshold": "1.5"}
    updates, _ = phase(rollout_correction=cfg).compute(records)
    assert updates[0]["response_mask"] == [0.0, 1.0, 0.0]
    assert updates[0]["advantages"][0] == 0.0 and updates[0]["advantages"][2] == 0.0
    assert updates[0]["advantages"][1] > 0
    assert "rollout_is_weights" not in updates[0]


def test_overlong_filter_trains_no_token_of_a_cut_trajectory_but_keeps_its_reward_in_the_baseline() -> None:
    # Rewards 1, 0, 0 in one group: mean 1/3, unbiased std sqrt(1/3). The third was cut at the
    # length limit: its advantage and mask go to 0, and the others keep the baseline with it.
    # The tool token (mask 0) of the first stays out.
    records = [
        record("g", 1.0, [-1.0, -1.0, -1.0], response_mask=[1, 0, 1], stop_reason="stop"),
        record("g", 0.0, [-1.0], stop_reason="max_turns"),
        record("g", 0.0, [-1.0, -2.0], stop_reason="length"),
    ]
    updates, metrics = phase(overlong_filter=True).compute(records)
    high, low = (2 / 3) / math.sqrt(1 / 3), -(1 / 3) / math.sqrt(1 / 3)
    assert updates[0]["advantages"] == pytest.approx([high, 0.0, high], rel=1e-5)
    assert updates[0]["response_mask"] == [1.0, 0.0, 1.0]
    assert updates[1]["advantages"] == pytest.approx([low], rel=1e-5)
    assert updates[1]["response_mask"] == [1.0]
    assert updates[2] == {"advantages": [0.0, 0.0], "response_mask": [0.0, 0.0]}
    assert metrics["response_length/overlong_filtered"] == pytest.approx(1 / 3)
    # off (the default), the cut trajectory trains like any other and the mask is not written
    updates, metrics = phase().compute(records)
    assert updates[2]["advantages"] == pytest.approx([low, low], rel=1e-5)
    assert "response_mask" not in updates[2] and "response_length/overlong_filtered" not in metrics


def test_overlong_penalty_tells_a_run_on_from_a_finished_wrong_answer() -> None:
    # A group with no right answer: two finished, two cut at the length limit. Bare, every score
    # is 0 and so is every advantage; with a penalty of 0.5 the scores are 0, 0, -0.5, -0.5:
    # mean -0.25, unbiased std sqrt(1/12) -> A = +-0.25 / sqrt(1/12) = +-0.866.
    records = [
        record("g", 0.0, [-1.0], stop_reason="stop"),
        record("g", 0.0, [-1.0], stop_reason="max_turns"),
        record("g", 0.0, [-1.0, -1.0], stop_reason="length"),
        record("g", 0.0, [-1.0, -1.0], stop_reason="length"),
    ]
    updates, metrics = phase(overlong_penalty=0.5).compute(records)
    a = 0.25 / math.sqrt(1 / 12)
    assert [u["advantages"] for u in updates] == [
        pytest.approx([a], rel=1e-5),
        pytest.approx([a], rel=1e-5),
        pytest.approx([-a, -a], rel=1e-5),
        pytest.approx([-a, -a], rel=1e-5),
    ]
    assert all("response_mask" not in u for u in updates)
    assert metrics["response_length/overlong_penalized"] == pytest.approx(0.5)
    assert records[2]["reward"] == 0.0  # the record's reward, what the run reports, is untouched
    updates, metrics = phase().compute(records)
    assert all(u["advantages"] == pytest.approx([0.0] * len(u["advantages"])) for u in updates)
    assert "response_length/overlong_penalized" not in metrics
    with pytest.raises(ValueError, match="overlong_penalty"):
        phase(overlong_penalty=-1.0)


def test_kl_in_reward_fixed_penalises_the_drifted_sample() -> None:
    # k1 KL per token = old - ref: sample 0 has 0.5 on each of 2 tokens (sum 1), sample 1 has 0.
    # scores = 1 - 0.1 * 1 = 0.9 and 1.0 -> mean 0.95, unbiased std 0.0707 -> A = -+0.7071.
    records = [
        record("g", 1.0, [-1.0, -1.0], ref_log_probs=[-1.5, -1.5]),
        record("g", 1.0, [-1.0], ref_log_probs=[-1.0]),
    ]
    updates, metrics = phase(kl_in_reward=True, kl_ctrl={"kl_coef": 0.1}).compute(records)
    a = 0.05 / math.sqrt(2 * 0.05**2)
    assert updates[0]["advantages"] == pytest.approx([-a, -a], rel=1e-4)
    assert updates[1]["advantages"] == pytest.approx([a], rel=1e-4)
    # Controller KL = mean over sequences of the token-mean KL = (0.5 + 0) / 2.
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.25)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)


def test_adaptive_kl_coefficient_carries_over_steps() -> None:
    # Adaptive: err = clip(0.25 / 0.1 - 1, +-0.2) = 0.2; beta *= 1 + 0.2 * B / horizon = 1 + 0.2 * 2 / 10.
    records = [
        record("g", 1.0, [-1.0, -1.0], ref_log_probs=[-1.5, -1.5]),
        record("g", 0.0, [-1.0], ref_log_probs=[-1.0]),
    ]
    kl_ctrl = {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 10}
    advantage_phase = phase(kl_in_reward=True, kl_ctrl=kl_ctrl)
    _, first = advantage_phase.compute(records)
    _, second = advantage_phase.compute(records)
    assert first["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert second["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1 * 1.04)


def test_kl_in_reward_without_ref_log_probs_fails_clearly() -> None:
    with pytest.raises(ValueError, match="ref phase"):
        phase(kl_in_reward=True).compute([record("g", 1.0, [-1.0])])


def test_bypass_copies_rollout_log_probs_and_fails_clearly_without_them() -> None:
    records = [record("g", 1.0, [-9.0, -9.0], [-0.5, -0.25]), record("g", 0.0, [-9.0], [-1.0])]
    assert bypass_old_log_probs(records) == [[-0.5, -0.25], [-1.0]]
    records[1]["rollout_log_probs"] = None
    with pytest.raises(MissingRolloutLogProbsError, match="bypass_mode"):
        bypass_old_log_probs(records)


def test_is_without_rollout_log_probs_fails_but_plain_runs_skip_the_metrics() -> None:
    records = [record("g", 1.0, [-1.0]), record("g", 0.0, [-1.0])]
    for r in records:
        del r["rollout_log_probs"]
    with pytest.raises(MissingRolloutLogProbsError):
        phase(rollout_correction={"preset": "token_is"}).compute(records)
    _, metrics = phase().compute(records)
    assert not any(key.startswith("rollout_corr/") for key in metrics)


def test_runbook_warning_is_logged_when_kl_crosses_the_collapse_threshold(caplog) -> None:
    # kl = mean(-(old - rollout)) = 1 > 0.5 on every token.
    records = [record("g", 1.0, [-2.0, -2.0], [-1.0, -1.0]), record("g", 0.0, [-2.0], [-1.0])]
    with caplog.at_level(logging.WARNING, logger="rl_train.algorithms.rollout_metrics"):
        _, metrics = phase().compute(records)
    assert metrics["rollout_corr/kl"] == pytest.approx(1.0)
    assert "risk of collapse" in caplog.text


def test_pad_and_unpad_response_round_trip_lists_and_tensors() -> None:
    records = [
        {"response_ids": [5, 6, 7], "x": [0.5, -1.0, 2.0]},
        {"response_ids": [5], "x": torch.tensor([3.0])},
        {"response_ids": [5, 6], "x": None},
        {"response_ids": [], "x": []},
    ]
    padded = pad_response(records, "x", fill=1.0)
    assert padded.tolist() == [[0.5, -1.0, 2.0], [3.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert unpad_response(padded, records) == [[0.5, -1.0, 2.0], [3.0], [1.0, 1.0], []]
    assert pad_response([], "x").shape == (0, 1)


def test_pad_response_names_a_field_whose_length_is_not_the_responses() -> None:
    records = [{"response_ids": [5, 6], "x": [0.1, 0.2]}, {"response_ids": [5, 6], "x": [0.1, 0.2, 0.3]}]
    with pytest.raises(ValueError, match="'x': 3 values for a response of 2 tokens"):
        pad_response(records, "x")
    with pytest.raises(ValueError, match="'x' is None"):
        pad_response([{"response_ids": [5], "x": None}], "x")


def test_an_infra_sample_is_left_out_of_its_group_and_trains_no_token() -> None:
    # Group g: 1, 0 and an infra sample (placeholder reward 0). Left out, g is [1, 0]: mean 0.5,
    # unbiased std sqrt(0.5), A = +-0.7071, as if the infra sample were absent. Counted as a 0, g
    # would be [1, 0, 0]: mean 1/3, std sqrt(1/3), A(1) = (2/3) / 0.577 = 1.155 instead.
    records = [
        record("g", 1.0, [-1.0, -2.0]),
        record("g", 0.0, [-0.3]),
        record("g", 0.0, [-0.4, -0.5], is_infra=True),
        record("h", 1.0, [-0.1], is_infra=False),
    ]
    updates, metrics = phase().compute(records)
    a = 0.5 / math.sqrt(0.5)
    assert updates[0]["advantages"] == pytest.approx([a, a], rel=1e-5)
    assert updates[1]["advantages"] == pytest.approx([-a], rel=1e-5)
    assert updates[2] == {"advantages": [0.0, 0.0], "response_mask": [0.0, 0.0]}  # no gradient from it
    assert updates[0]["response_mask"] == [1.0, 1.0] and updates[3]["response_mask"] == [1.0]
    # 2 tokens at +a, 1 at -a, 1 at 0 (h alone) over the 4 graded tokens; the infra tokens are not graded.
    assert metrics["advantage/mean"] == pytest.approx(a / 4, rel=1e-5)
    # Without an infra sample in the batch, nothing but the advantages is written (as before).
    assert [sorted(u) for u in phase().compute(records[:2])[0]] == [["advantages"]] * 2


def test_a_batch_of_only_infra_samples_trains_nothing() -> None:
    records = [record("g", 0.0, [-1.0], is_infra=True), record("g", 0.0, [-2.0], is_infra=True)]
    updates, metrics = phase().compute(records)
    assert updates == [{"advantages": [0.0], "response_mask": [0.0]}] * 2 and metrics["advantage/mean"] == 0.0
