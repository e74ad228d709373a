"""Advantage estimators against hand-computed values, plus group invariants."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_train.algorithms.advantage import ADV_ESTIMATORS
from rl_train.algorithms.advantage_base import AdvantageInputs
from rl_train.algorithms.config import AlgorithmConfig

Builder = Callable[..., tuple[torch.Tensor, torch.Tensor]]
EXPECTED_NAMES = {
    "gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
}  # fmt: skip


def per_sample(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The (constant) advantage on each sample's response tokens, checking it is constant."""
    out = []
    for row, m in zip(adv, mask.bool(), strict=True):
        values = row[m]
        assert torch.allclose(values, values[0].expand_as(values))
        out.append(float(values[0]))
    return out


def run(name: str, inputs: AdvantageInputs, **cfg: object) -> tuple[torch.Tensor, torch.Tensor]:
    return ADV_ESTIMATORS.get(name)(inputs, AlgorithmConfig(adv_estimator=name, **cfg))


def test_every_estimator_is_registered() -> None:
    assert set(ADV_ESTIMATORS.names()) >= EXPECTED_NAMES


@pytest.mark.parametrize(
    ("norm", "expected"),
    [
        # group a = [1, 0, 0.5]: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
        # -> (s - 0.5) / 0.5 = [1, -1, 0]; group b has one sample -> 0.
        (True, [1.0, -1.0, 0.0, 0.0]),
        (False, [0.5, -0.5, 0.0, 0.0]),
    ],
)
def test_grpo_hand_values(make_outcome: Builder, norm: bool, expected: list[float]) -> None:
    rewards, mask = make_outcome([1.0, 0.0, 0.5, 2.0], [2, 3, 1, 2])
    adv, returns = run(
        "grpo", AdvantageInputs(rewards, mask, ["a", "a", "a", "b"]), norm_adv_by_std_in_grpo=norm
    )
    assert per_sample(adv, mask) == pytest.approx(expected, abs=1e-5)
    assert torch.equal(adv, returns)
    assert torch.all(adv[mask == 0] == 0)


def test_grpo_passk_credits_only_the_best(make_outcome: Builder) -> None:
    # best = 1.0, second best = 0.5 -> gap 0.5; std 0.5 -> 1.0 for the best, 0 for the others.
    rewards, mask = make_outcome([1.0, 0.0, 0.5], [1, 2, 3])
    adv, _ = run("grpo_passk", AdvantageInputs(rewards, mask, ["a"] * 3))
    assert per_sample(adv, mask) == pytest.approx([1.0, 0.0, 0.0], abs=1e-5)
    adv, _ = run("grpo_passk", AdvantageInputs(rewards, mask, ["a"] * 3), norm_adv_by_std_in_grpo=False)
    assert per_sample(adv, mask) == pytest.approx([0.5, 0.0, 0.0])


def test_rloo_leave_one_out(make_outcome: Builder) -> None:
    # A_i = s_i - mean(others): 1 - 0.25 = 0.75, 0 - 0.75 = -0.75, 0.5 - 0.5 = 0; lone sample -> 0.
    rewards, mask = make_outcome([1.0, 0.0, 0.5, 3.0], [1, 1, 1, 1])
    adv, _ = run("rloo", AdvantageInputs(rewards, mask, ["a", "a", "a", "b"]))
    assert per_sample(adv, mask) == pytest.approx([0.75, -0.75, 0.0, 0.0])


def test_opo_length_weighted_baseline(make_outcome: Builder) -> None:
    # lengths [1, 3]: b = (1 * 1 + 3 * 0) / 4 = 0.25 -> [0.75, -0.25]
    rewards, mask = make_outcome([1.0, 0.0], [1, 3])
    adv, _ = run("opo", AdvantageInputs(rewards, mask, ["a", "a"]))
    assert per_sample(adv, mask) == pytest.approx([0.75, -0.25])


@pytest.mark.parametrize("norm", [True, False])
def test_gpg_rescales_by_valid_fraction_without_std(make_outcome: Builder, norm: bool) -> None:
    # group a [1, 0] has signal, group b [1, 1] none: alpha = B / B_valid = 4 / 2 = 2;
    # centred a = [0.5, -0.5] -> [1, -1]; b -> [0, 0]. GPG never divides by the group std, whatever
    # norm_adv_by_std_in_grpo says (dividing by std [1, 0] = 0.7071 would give +-1.414).
    rewards, mask = make_outcome([1.0, 0.0, 1.0, 1.0], [1, 2, 1, 1])
    adv, _ = run("gpg", AdvantageInputs(rewards, mask, ["a", "a", "b", "b"]), norm_adv_by_std_in_grpo=norm)
    assert per_sample(adv, mask) == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_reinforce_plus_plus_baseline_whitens_over_batch(make_outcome: Builder) -> None:
    # centred per group: [0.5, -0.5, 0, 0] on one token each; batch mean 0,
    # unbiased var (0.25 + 0.25) / 3 = 1/6 -> divide by sqrt(1/6) = 0.40825 -> +-1.22474.
    rewards, mask = make_outcome([1.0, 0.0, 0.0, 0.0], [1, 1, 1, 1])
    adv, _ = run("reinforce_plus_plus_baseline", AdvantageInputs(rewards, mask, ["a", "a", "b", "b"]))
    assert per_sample(adv, mask) == pytest.approx([1.224744, -1.224744, 0.0, 0.0], abs=1e-5)


def test_gae_hand_values() -> None:
    # prompt at positions 0-1, response at 2-3: r = [0, 1], V = [0.5, 0.8], gamma = lam = 1.
    # t=3: delta = 1 + 0 - 0.8 = 0.2, A = 0.2; t=2: delta = 0 + 0.8 - 0.5 = 0.3, A = 0.3 + 0.2 = 0.5.
    # returns = A + V = [1.0, 1.0]; whitened A: mean 0.35, unbiased std 0.2121 -> [+0.7071, -0.7071].
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[9.0, 9.0, 0.5, 0.8]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    adv, returns = run("gae", AdvantageInputs(rewards, mask, ["a"], values=values))
    assert returns[0, 2:].tolist() == pytest.approx([1.0, 1.0])
    assert adv[0].tolist() == pytest.approx([0.0, 0.0, 0.70710, -0.70710], abs=1e-4)


def test_gae_skips_observation_tokens() -> None:
    # Turn 1 at positions 1-2, a tool observation at 3 (mask 0), turn 2 at 4 with reward 1.
    # V = 0, gamma = 0.5, lam = 1: A4 = 1; position 3 is skipped; A2 = 0.5 * A4 = 0.5; A1 = 0.25.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 7.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.zeros_like(rewards)
    _, returns = run("gae", AdvantageInputs(rewards, mask, ["a"], values=values), gamma=0.5)
    assert returns[0].tolist() == pytest.approx([0.0, 0.25, 0.5, 0.0, 1.0])


def test_reinforce_plus_plus_discounts_over_generated_tokens() -> None:
    # Same layout as above: G = [0.25, 0.5, -, 1]; advantages whitened over the 3 tokens:
    # mean 7/12, unbiased var = ((1/3)^2 + (1/12)^2 + (5/12)^2) / 2 = 0.1458 -> std 0.3819.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 7.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    adv, returns = run("reinforce_plus_plus", AdvantageInputs(rewards, mask, ["a"]), gamma=0.5)
    assert returns[0].tolist() == pytest.approx([0.0, 0.25, 0.5, 0.0, 1.0])
    std = (((1 / 3) ** 2 + (1 / 12) ** 2 + (5 / 12) ** 2) / 2) ** 0.5
    expected = [0.0, (0.25 - 7 / 12) / std, (0.5 - 7 / 12) / std, 0.0, (1 - 7 / 12) / std]
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_remax_subtracts_greedy_baseline(make_outcome: Builder) -> None:
    # Return-to-go is 1 on every response token (reward 1 at the end); baseline 0.4 -> 0.6.
    rewards, mask = make_outcome([1.0], [3])
    inputs = AdvantageInputs(rewards, mask, ["a"], reward_baselines=torch.tensor([0.4], dtype=torch.float64))
    adv, _ = run("remax", inputs)
    assert per_sample(adv, mask) == pytest.approx([0.6])
    with pytest.raises(ValueError, match="reward_baselines"):
        run("remax", AdvantageInputs(rewards, mask, ["a"]))


def test_gae_without_values_fails_clearly(make_outcome: Builder) -> None:
    rewards, mask = make_outcome([1.0], [2])
    with pytest.raises(ValueError, match="critic values"):
        run("gae", AdvantageInputs(rewards, mask, ["a"]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_session_last_output_votes_and_broadcasts(make_outcome: Builder, name: str) -> None:
    # Session s1 = samples 0 and 1 (its last output, score 1, is the vote); s2 = sample 2 (score 0).
    # Group statistics on [1, 0]: grpo (no std) -> [0.5, -0.5]; rloo -> [1, -1]. Sample 0's own
    # score 5 is ignored; it receives its session's advantage.
    rewards, mask = make_outcome([5.0, 1.0, 0.0], [2, 1, 3])
    inputs = AdvantageInputs(rewards, mask, ["g"] * 3, session_ids=["s1", "s1", "s2"])
    adv, _ = run(name, inputs, norm_adv_by_std_in_grpo=False)
    top = {"grpo": 0.5, "rloo": 1.0}[name]
    assert per_sample(adv, mask) == pytest.approx([top, top, -top])


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk"])
def test_result_depends_on_mask_not_positions(make_outcome: Builder, name: str) -> None:
    scores, lengths, groups = [1.0, 0.0, 0.3, 0.7], [2, 3, 1, 4], ["a", "a", "b", "b"]
    short, short_mask = make_outcome(scores, lengths, prompt_len=1)
    long, long_mask = make_outcome(scores, lengths, prompt_len=5)
    adv_short, _ = run(name, AdvantageInputs(short, short_mask, groups))
    adv_long, _ = run(name, AdvantageInputs(long, long_mask, groups))
    assert torch.allclose(adv_short[short_mask.bool()], adv_long[long_mask.bool()])


@settings(max_examples=40, deadline=None)
@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=12),
    num_groups=st.integers(1, 4),
    norm=st.booleans(),
)
def test_grpo_sums_to_zero_per_group(scores: list[float], num_groups: int, norm: bool) -> None:
    groups = [f"g{i % num_groups}" for i in range(len(scores))]
    rewards = torch.tensor(scores, dtype=torch.float64).unsqueeze(-1)
    mask = torch.ones_like(rewards)
    adv, _ = run("grpo", AdvantageInputs(rewards, mask, groups), norm_adv_by_std_in_grpo=norm)
    for gid in set(groups):
        idx = [i for i, g in enumerate(groups) if g == gid]
        assert float(adv[idx].sum()) == pytest.approx(0.0, abs=1e-6)
