"""DAPO group filter (R-7.3) and groupwise advantage redistribution (R-6.6)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_train.algorithms.gar import redistribute_group_advantages
from rl_train.algorithms.group_filter import classify_groups, refill_credit


def test_classify_groups() -> None:
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.0]
    groups = [
        "mixed",
        "mixed",
        "same",
        "same",
        "infra_only",
        "one_left",
        "one_left",
        "infra_hides",
        "infra_hides",
    ]
    infra = [False, False, False, False, True, True, False, False, True]
    assert classify_groups(scores, groups, infra) == {
        "mixed": True,  # 1 vs 0
        "same": False,  # std 0
        "infra_only": False,  # no valid sample
        "one_left": False,  # a single valid sample
        "infra_hides": False,  # the differing sample is infra, the valid one is alone
    }


def test_classify_groups_without_infra_flags_and_bad_lengths() -> None:
    assert classify_groups([0.0, 0.1], ["g", "g"]) == {"g": True}
    with pytest.raises(ValueError, match="one entry per sample"):
        classify_groups([0.0], ["g", "g"])


def test_refill_credit() -> None:
    assert refill_credit(3) == 6
    assert refill_credit(3, num_failed_groups=2, refill_failed=True) == 8
    assert refill_credit(3, num_failed_groups=2, refill_failed=False) == 6


def test_gar_hand_values() -> None:
    # rewards [1, 1, 0, 0], no std normalisation: mean 0.5 -> A = [0.5, 0.5, -0.5, -0.5].
    # passers 0, 1 with f = [1, 0.5]: f*A = [0.5, 0.25], c = 1.0 / 0.75 -> [0.6667, 0.3333];
    # failing samples keep -0.5; positive mass 1.0 preserved.
    adv = redistribute_group_advantages(
        torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64),
        torch.tensor([True, True, False, False]),
        torch.tensor([1.0, 0.5, 1.0, 1.0], dtype=torch.float64),
        torch.zeros(4, dtype=torch.bool),
        norm_by_std=False,
    )
    assert adv.tolist() == pytest.approx([2 / 3, 1 / 3, -0.5, -0.5])


def test_gar_zeroes_hackers_and_recomputes_statistics() -> None:
    # sample 2 passed but is a confirmed hacker: effective rewards [1, 1, 0, 0] (same as above
    # with sample 2 moved), mean 0.5 -> A = [0.5, 0.5, -0.5, -0.5]; no redistribution (f = 1).
    adv = redistribute_group_advantages(
        torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64),
        torch.tensor([True, True, True, False]),
        torch.ones(4, dtype=torch.float64),
        torch.tensor([False, False, True, False]),
        norm_by_std=False,
    )
    assert adv.tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])


def test_gar_rejects_bad_quality() -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        redistribute_group_advantages(
            torch.zeros(2), torch.ones(2, dtype=torch.bool), torch.zeros(2), torch.zeros(2)
        )


@settings(max_examples=50, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.floats(0, 1), st.booleans(), st.floats(0.05, 1.0), st.booleans()), min_size=2, max_size=8
    ),
    norm=st.booleans(),
)
def test_gar_preserves_positive_mass_and_failures(
    data: list[tuple[float, bool, float, bool]], norm: bool
) -> None:
    rewards, passed, quality, hacked = (
        torch.tensor(col, dtype=torch.float64) for col in zip(*data, strict=True)
    )
    passed, hacked = passed.bool(), hacked.bool()
    adv = redistribute_group_advantages(rewards, passed, quality, hacked, norm_by_std=norm)
    # reference: plain group advantages on the hacker-zeroed rewards
    effective = torch.where(hacked, 0.0, rewards)
    base = effective - effective.mean()
    if norm:
        base = base / (effective.std() + 1e-6)
    assert float(adv.clamp(min=0).sum()) == pytest.approx(float(base.clamp(min=0).sum()), abs=1e-9)
    failing = ~passed | hacked
    assert torch.allclose(adv[failing], base[failing])
    assert torch.all(adv[hacked] <= 1e-12 + base.max())
