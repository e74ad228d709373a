"""Rollout correction: IS (TIS / IcePop, token / sequence, batch normalisation), RS, metrics."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_train.algorithms.config import RolloutCorrectionConfig
from rl_train.algorithms.rollout_correction import (
    MissingRolloutLogProbsError,
    bypass_old_log_prob,
    compute_rollout_correction,
)
from rl_train.algorithms.rollout_metrics import RunbookMonitor
from rl_train.algorithms.thresholds import RS_OPTIONS

# Two sequences; position 0 is prompt. Token ratios pi_old / pi_rollout on the response:
# row 0: [0.5, 1.0, 4.0] (sequence ratio 2.0); row 1: [2.0, 1.5] (sequence ratio 3.0).
RATIOS = torch.tensor([[1.0, 0.5, 1.0, 4.0], [1.0, 2.0, 1.5, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
ROLLOUT = torch.full_like(RATIOS, math.log(0.5))
OLD = ROLLOUT + RATIOS.log()


def correct(**fields: object) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    return compute_rollout_correction(OLD, ROLLOUT, MASK, RolloutCorrectionConfig(**fields))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # TIS at 2: 4.0 -> 2.0, the rest unchanged.
        ({"rollout_is": "token", "rollout_is_threshold": 2.0}, [[0, 0.5, 1, 2], [0, 2, 1.5, 0]]),
        # IcePop [0.5, 2] (closed): 4.0 is outside -> 0.
        ({"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"}, [[0, 0.5, 1, 0], [0, 2, 1.5, 0]]),
        # Sequence TIS at 2.5: row 0 keeps 2.0, row 1's 3.0 -> 2.5, broadcast over the response.
        ({"rollout_is": "sequence", "rollout_is_threshold": 2.5}, [[0, 2, 2, 2], [0, 2.5, 2.5, 0]]),
        # Sequence IcePop [0.5, 2.5]: row 1 (3.0) zeroed.
        ({"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.5"}, [[0, 2, 2, 2], [0, 0, 0, 0]]),
        # Token TIS 2 then batch-normalised: weights [0.5, 1, 2, 2, 1.5] have mean 1.4.
        (
            {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True},
            [[0, 0.5 / 1.4, 1 / 1.4, 2 / 1.4], [0, 2 / 1.4, 1.5 / 1.4, 0]],
        ),
        # Sequence TIS 2.5 normalised over sequences: [2, 2.5] / 2.25.
        (
            {"rollout_is": "sequence", "rollout_is_threshold": 2.5, "rollout_is_batch_normalize": True},
            [[0, 2 / 2.25, 2 / 2.25, 2 / 2.25], [0, 2.5 / 2.25, 2.5 / 2.25, 0]],
        ),
    ],
)
def test_is_weights(fields: dict, expected: list[list[float]]) -> None:
    weights, new_mask, _ = correct(**fields)
    assert weights is not None
    assert torch.allclose(weights, torch.tensor(expected, dtype=torch.float64))
    assert torch.equal(new_mask, MASK)


def test_sequence_is_bounds_the_summed_log_ratio_not_the_tokens() -> None:
    # Token log-ratios old - rollout = [25, -10, -10]: the raw sum 5 gives the sequence weight
    # e^5 = 148.41 (under the TIS threshold 200); clamping the 25 to 20 first would give e^0 = 1.
    # chi2_seq = e^(2 * 5) - 1 over the one sequence.
    rollout = torch.full((1, 3), -30.0, dtype=torch.float64)
    old = rollout + torch.tensor([[25.0, -10.0, -10.0]], dtype=torch.float64)
    mask = torch.ones_like(old)
    cfg = RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold="200")
    weights, _, metrics = compute_rollout_correction(old, rollout, mask, cfg)
    assert weights is not None
    assert weights[0].tolist() == pytest.approx([math.exp(5.0)] * 3, rel=1e-12)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx(math.exp(10.0) - 1, rel=1e-12)
    # The bound applies to the aggregate: [25, 0, 0] sums to 25 -> e^20, truncated at u = 1e9 only above.
    old = rollout + torch.tensor([[25.0, 0.0, 0.0]], dtype=torch.float64)
    cfg = RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold="1e9")
    weights, _, _ = compute_rollout_correction(old, rollout, mask, cfg)
    assert weights is not None and weights[0].tolist() == pytest.approx([math.exp(20.0)] * 3, rel=1e-12)


def test_is_weights_are_detached() -> None:
    old = OLD.clone().requires_grad_(True)
    weights, _, _ = compute_rollout_correction(
        old, ROLLOUT, MASK, RolloutCorrectionConfig(rollout_is="token")
    )
    assert weights is not None and not weights.requires_grad and weights.grad_fn is None


@pytest.mark.parametrize(
    ("rs", "threshold", "expected_mask"),
    [
        # k1 ratios pi_rollout / pi_old = 1 / RATIOS in [1/2, 2]: only 1/4 fails.
        ("token_k1", "2.0", [[0, 1, 1, 0], [0, 1, 1, 0]]),
        # sequence ratios pi_rollout / pi_old 1/2 and 1/3 against [0.4, 2.5]: row 1 rejected.
        ("seq_sum_k1", "2.5", [[0, 1, 1, 1], [0, 0, 0, 0]]),
        # k3 = r - 1 - ln r: row 0 mean (0.19315 + 0 + 1.61371) / 3 = 0.6023 > 0.5 -> rejected;
        # row 1 mean (0.30685 + 0.09453) / 2 = 0.2007 kept.
        ("seq_mean_k3", "0.5", [[0, 0, 0, 0], [0, 1, 1, 0]]),
        # k2 = 0.5 ln^2 r: row 0 max 0.5 ln^2 4 = 0.961 > 0.5; row 1 max 0.5 ln^2 2 = 0.240.
        ("seq_max_k2", "0.5", [[0, 0, 0, 0], [0, 1, 1, 0]]),
        # AND of the first two rules.
        ("token_k1,seq_sum_k1", "2.0,2.5", [[0, 1, 1, 0], [0, 0, 0, 0]]),
    ],
)
def test_rejection_sampling(rs: str, threshold: str, expected_mask: list[list[float]]) -> None:
    weights, new_mask, metrics = correct(rollout_rs=rs, rollout_rs_threshold=threshold)
    assert weights is None
    expected = torch.tensor(expected_mask, dtype=torch.float64)
    assert torch.equal(new_mask, expected)
    removed = 1 - float(expected.sum()) / float(MASK.sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(removed)


def test_sequence_is_runs_over_the_tokens_rs_kept() -> None:
    # token_k1 at 2 rejects row 0's ratio-4 token (pi_rollout / pi_old = 1/4). Row 0's sequence
    # weight is then 0.5 * 1 = 0.5 over the kept tokens (over the input mask it would be 2.0);
    # row 1 keeps both tokens: 2 * 1.5 = 3, truncated to 2.
    weights, new_mask, _ = correct(rollout_is="sequence", rollout_rs="token_k1", rollout_rs_threshold="2.0")
    assert weights is not None
    assert new_mask.tolist() == [[0, 1, 1, 0], [0, 1, 1, 0]]
    assert torch.allclose(weights, torch.tensor([[0, 0.5, 0.5, 0], [0, 2, 2, 0]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("rs", "expected_mask"),
    [
        # k1 bounds apply to pi_rollout / pi_old, the reference's ratio (the inverse of the IS weight).
        # Row 0 pi_old / pi_rollout [0.25, 2.5, 1, 0.4] is pi_rollout / pi_old [4, 0.4, 1, 2.5]:
        # [0.5, 3] keeps [no, no, yes, yes] (bounding pi_old / pi_rollout would keep [no, yes, yes, no]).
        # Row 1 [2.5, 1] -> [0.4, 1]: [no, yes]. Row 2 [0.4, 1] -> [2.5, 1]: [yes, yes].
        ("token_k1", [[0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 0, 0]]),
        # Sequence ratios pi_rollout / pi_old: row 0 4 * 0.4 * 1 * 2.5 = 4 (out), row 1 0.4 (out),
        # row 2 2.5 (in).
        ("seq_sum_k1", [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]),
    ],
)
def test_asymmetric_k1_bounds_use_the_reference_ratio(rs: str, expected_mask: list[list[float]]) -> None:
    rows = [[0.25, 2.5, 1.0, 0.4], [2.5, 1.0, 1.0, 1.0], [0.4, 1.0, 1.0, 1.0]]
    ratios = torch.tensor(rows, dtype=torch.float64)
    mask = torch.tensor([[1.0] * 4, [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    rollout = torch.full_like(ratios, math.log(0.1))
    cfg = RolloutCorrectionConfig(rollout_rs=rs, rollout_rs_threshold="0.5_3.0")
    _, new_mask, _ = compute_rollout_correction(rollout + ratios.log(), rollout, mask, cfg)
    assert new_mask.tolist() == expected_mask


def test_off_policy_metrics_hand_values() -> None:
    # log-ratios lr = ln [0.5, 1, 4, 2, 1.5]; k1 = -lr; k3 = r - 1 - lr; chi2 = E[r^2] - 1.
    lr = [math.log(r) for r in (0.5, 1.0, 4.0, 2.0, 1.5)]
    r = [0.5, 1.0, 4.0, 2.0, 1.5]
    m_diff = [-(lr[0] + lr[1] + lr[2]) / 3, -(lr[3] + lr[4]) / 2]  # m_i(rollout) - m_i(old)
    _, _, metrics = correct(rollout_is="token", rollout_is_threshold=2.0)
    assert metrics["rollout_corr/kl"] == pytest.approx(-sum(lr) / 5)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(sum(x - 1 - math.log(x) for x in r) / 5)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(sum(x * x for x in r) / 5 - 1)  # 3.7
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx((2.0**2 + 3.0**2) / 2 - 1)  # 5.5
    assert metrics["rollout_corr/rollout_ppl"] == pytest.approx(2.0)  # every rollout prob is 0.5
    assert metrics["rollout_corr/training_ppl"] == pytest.approx(sum(2 * math.exp(d) for d in m_diff) / 2)
    assert metrics["rollout_corr/log_ppl_diff"] == pytest.approx(sum(m_diff) / 2)
    assert metrics["rollout_corr/ppl_ratio"] == pytest.approx(sum(math.exp(d) for d in m_diff) / 2)
    # TIS weights [0.5, 1, 2, 2, 1.5]: mean 1.4; ESS = 7^2 / (5 * 11.5).
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.4)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(49 / 57.5)


def test_bypass_mode_makes_correction_trivial() -> None:
    old = bypass_old_log_prob(ROLLOUT)
    weights, new_mask, metrics = compute_rollout_correction(
        old, ROLLOUT, MASK, RolloutCorrectionConfig(preset="token_is_k3_rs")
    )
    assert weights is not None and torch.equal(weights, MASK)
    assert torch.equal(new_mask, MASK)
    assert metrics["rollout_corr/kl"] == 0 and metrics["rollout_corr/chi2_seq"] == 0
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)


def test_missing_rollout_log_probs_fail_clearly() -> None:
    with pytest.raises(MissingRolloutLogProbsError, match="bypass_mode"):
        bypass_old_log_prob(None)
    with pytest.raises(MissingRolloutLogProbsError, match="rollout_log_probs"):
        compute_rollout_correction(OLD, None, MASK, RolloutCorrectionConfig(rollout_is="token"))
    weights, mask, metrics = compute_rollout_correction(OLD, None, MASK, RolloutCorrectionConfig())
    assert weights is None and torch.equal(mask, MASK) and metrics == {}


@settings(max_examples=40, deadline=None)
@given(
    options=st.lists(st.sampled_from(RS_OPTIONS.names()), min_size=1, max_size=3, unique=True),
    threshold=st.floats(1.01, 5.0),
    seed=st.integers(0, 2**16),
)
def test_rs_mask_is_a_subset_of_the_input_mask(options: list[str], threshold: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    rollout = old + 0.5 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).to(torch.float64)
    cfg = RolloutCorrectionConfig(
        rollout_rs=",".join(options), rollout_rs_threshold=threshold, rollout_is="token"
    )
    weights, new_mask, _ = compute_rollout_correction(old, rollout, mask, cfg)
    assert torch.all(new_mask <= mask)
    assert weights is not None and torch.all(weights[new_mask == 0] == 0)


def test_runbook_warnings(caplog: pytest.LogCaptureFixture) -> None:
    monitor = RunbookMonitor()
    with caplog.at_level(logging.WARNING):
        found = monitor.check(
            {
                "rollout_corr/kl": 0.6,
                "rollout_corr/chi2_seq": 11.0,
                "rollout_corr/rollout_is_eff_sample_size": 0.1,
            }
        )
    assert len(found) == 3 and "collapse" in found[0] and "rejection" in found[1] and "tighten" in found[2]
    assert "collapse" in caplog.text
    # k3_kl rising three steps in a row warns only at the third rise.
    rising = [monitor.check({"rollout_corr/k3_kl": v, "rollout_corr/kl": 0.0}) for v in (0.1, 0.2, 0.3, 0.4)]
    assert [len(w) for w in rising] == [0, 0, 0, 1] and "k3_kl" in rising[-1][0]
