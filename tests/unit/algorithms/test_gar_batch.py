"""GAR in the advantage phase (R-6.6): the records' grader verdicts reshape each graded group's
advantages exactly as the one-group oracle (``redistribute_group_advantages``) does, and leave
ungraded groups, failed graders and infra samples alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_train.algorithms.advantage_phase import AdvantagePhase
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.algorithms.gar import GarGrades, redistribute_group_advantages, reshape_batch


def record(group: str, reward: float, length: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "group_id": group,
        "reward": reward,
        "response_ids": list(range(length)),
        "old_log_probs": [-1.0] * length,
        **extra,
    }


def graded(quality: float = 1.0, hacking: bool = False, infra: str = "") -> dict[str, Any]:
    return {"gar_quality": quality, "gar_hacking": hacking, "gar_infra": infra}


def phase(threshold: float | None = 1.0, **algorithm: Any) -> AdvantagePhase:
    return AdvantagePhase.from_config(AlgorithmConfig.model_validate(algorithm), threshold)


def first_tokens(updates: list[dict[str, Any]]) -> list[float]:
    return [u["advantages"][0] for u in updates]


def test_graded_groups_match_the_oracle_and_the_rest_are_untouched() -> None:
    g = [record("g", 1.0, **graded(1.0)), record("g", 1.0, **graded(0.25)), record("g", 1.0, **graded(0.5, True)),
         record("g", 0.0, **graded()), record("g", 0.0, **graded())]  # fmt: skip
    failed = [
        record("f", 1.0, **graded(infra="judge timed out")),
        record("f", 0.0, **graded(infra="judge timed out")),
    ]
    never = [record("n", 1.0), record("n", 0.0), record("n", 1.0)]
    infra = [
        record("i", 1.0, **graded(0.5)),
        record("i", 0.0, is_infra=True, **graded()),
        record("i", 0.0, **graded()),
    ]
    records = g + failed + never + infra
    updates, metrics = phase().compute(records)
    plain, plain_metrics = phase(None).compute(records)
    oracle = redistribute_group_advantages(
        torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]),
        torch.tensor([True, True, True, False, False]),
        torch.tensor([1.0, 0.25, 0.5, 1.0, 1.0]),
        torch.tensor([False, False, True, False, False]),
    )
    assert first_tokens(updates[:5]) == pytest.approx(oracle.tolist(), abs=1e-6)
    assert first_tokens(updates[5:10]) == pytest.approx(first_tokens(plain[5:10]), abs=1e-7)  # no verdict
    # the infra sample is out; the other two form a group of two with full quality -> GRPO's
    assert first_tokens(updates[10:]) == pytest.approx(first_tokens(plain[10:]), abs=1e-7)
    assert updates[11]["advantages"] == [0.0, 0.0] and updates[11]["response_mask"] == [0.0, 0.0]
    a = first_tokens(updates[:5])
    assert a[2] < 0 and a[0] > a[1] > 0 and a[1] > a[3]  # the hacker fails; quality orders the passers
    assert metrics["gar/hacking_flagged"] == 1.0 and metrics["gar/infra_groups"] == 1.0
    assert metrics["gar/groups_reshaped"] == 1.0
    assert not any(k.startswith("gar/") for k in plain_metrics)


def test_every_outcome_estimator_keeps_the_group_positive_mass() -> None:
    qualities = [1.0, 0.2, 0.6, 1.0]
    records = [record("g", r, **graded(q)) for r, q in zip([1.0, 1.0, 1.0, 0.0], qualities, strict=True)]
    for estimator in ("grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"):
        plain = first_tokens(phase(None, adv_estimator=estimator).compute(records)[0])
        gar = first_tokens(phase(adv_estimator=estimator).compute(records)[0])
        positive = [i for i, a in enumerate(plain) if a > 0]
        assert positive, estimator
        assert sum(gar[i] for i in positive) == pytest.approx(sum(plain[i] for i in positive), rel=1e-5), (
            estimator
        )
        assert [gar[i] for i, a in enumerate(plain) if a <= 0] == pytest.approx(
            [a for a in plain if a <= 0]
        ), estimator
        assert gar[0] > plain[0] and gar[1] < plain[1], estimator


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.05, 1.0), st.booleans()),
        min_size=2,
        max_size=8,
    )
)
def test_reshape_batch_is_the_oracle_on_grpo(members: list[tuple[float, float, bool]]) -> None:
    rewards = torch.tensor([m[0] for m in members])
    quality = torch.tensor([m[1] for m in members])
    passed = rewards >= 1.0
    hacked = torch.tensor([m[2] for m in members]) & passed
    grades = GarGrades(torch.ones(len(members), dtype=torch.bool), quality, hacked, passed)
    effective = grades.effective_scores(rewards)
    centred = effective - effective.mean()
    grpo = centred / (effective.std(unbiased=True) + 1e-6)
    mask = torch.ones(len(members), 3)
    reshaped, _ = reshape_batch(grpo.unsqueeze(-1) * mask, mask, ["g"] * len(members), grades)
    oracle = redistribute_group_advantages(rewards, passed, quality, hacked)
    assert torch.allclose(reshaped[:, 0], oracle, atol=1e-5)
    assert torch.allclose(reshaped[:, 0], reshaped[:, 2])
    assert float(reshaped[hacked, 0].clamp(min=0).sum()) == 0.0  # a hacker gains nothing
