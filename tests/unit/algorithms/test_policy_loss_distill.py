"""The distillation losses (R-4.10) against float64 hand derivations, gradients included.

The references use Python floats and explicit loops only, written from the formulas:
- reverse_kl: A_t = teacher_t - old_t, r_t = exp(new_t - old_t),
  l_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and for A < 0 min(l_t, -A c);
  d l_t / d new_t = -A r where the unclipped branch is the active one, else 0.
- forward_kl_topk: p = softmax over the k of the teacher's top-k log-probs, q = softmax over the
  k of the student's log-probs at those ids; l_t = sum_j p_j (log p_j - log q_j);
  d l_t / d s_j = q_j - p_j (the p_j sum to 1), nothing towards the teacher.
- distillation_ppo: vanilla on the task's A plus coef x the term.
Then the loss is aggregated by hand (token-mean, seq-mean-token-mean) with masks and IS weights.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from pydantic import ValidationError

from rl_train.algorithms.aggregation import aggregate_loss
from rl_train.algorithms.config import PolicyLossConfig
from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.policy_loss_base import PolicyLossInputs
from rl_train.algorithms.teacher_fields import DISTILL_TERMS, TEACHER_TOPK_IDS, teacher_fields

B, T, K = 4, 7, 3
EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0
DISTILL_LOSSES = ("reverse_kl", "forward_kl_topk", "distillation_ppo")


def _data(seed: int) -> dict[str, list]:
    """Random float64 inputs; the teacher's top-k mass is well below 1 (0.05-0.6), and so is the
    student's at those ids."""
    rng = random.Random(seed)
    mask = []
    for _ in range(B):
        start, length = rng.randint(1, 2), rng.randint(1, 4)
        mask.append([1.0 if start <= t < start + length else 0.0 for t in range(T)])
    mask[-1] = [0.0] * T  # a row with no graded token

    def topk_row() -> list[float]:
        probs = sorted((rng.uniform(0.01, 0.2) for _ in range(K)), reverse=True)
        return [math.log(p) for p in probs]

    return {
        "mask": mask,
        "old": [[rng.uniform(-3, -0.2) for _ in range(T)] for _ in range(B)],
        # new - old within +-0.6: some ratios leave the clip range on either side
        "delta": [[rng.uniform(-0.6, 0.6) for _ in range(T)] for _ in range(B)],
        "teacher": [[rng.uniform(-3, -0.2) for _ in range(T)] for _ in range(B)],
        "adv": [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(B)],
        "is": [[rng.uniform(0.3, 2.0) for _ in range(T)] for _ in range(B)],
        "t_topk": [[topk_row() for _ in range(T)] for _ in range(B)],
        "s_topk": [[topk_row() for _ in range(T)] for _ in range(B)],
    }


def _inputs(data: dict[str, list], with_is: bool) -> PolicyLossInputs:
    def t64(rows: list) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float64)

    old = t64(data["old"])
    return PolicyLossInputs(
        old_log_prob=old,
        log_prob=(old + t64(data["delta"])).requires_grad_(True),
        advantages=t64(data["adv"]),
        response_mask=t64(data["mask"]),
        rollout_is_weights=t64(data["is"]) if with_is else None,
        teacher_log_probs=t64(data["teacher"]),
        teacher_topk_log_probs=t64(data["t_topk"]).requires_grad_(True),
        student_topk_log_probs=t64(data["s_topk"]).requires_grad_(True),
    )


def _ppo_token(a: float, log_ratio: float) -> tuple[float, float]:
    """(loss, d loss / d new) of the dual-clip PPO surrogate at one token."""
    r = math.exp(log_ratio)
    clipped_r = min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
    unclipped, clipped = -a * r, -a * clipped_r
    loss, grad = (unclipped, -a * r) if unclipped >= clipped else (clipped, 0.0)
    if a < 0 and -a * C < loss:
        loss, grad = -a * C, 0.0
    return loss, grad


def _forward_kl_token(teacher: list[float], student: list[float]) -> tuple[float, list[float]]:
    """(KL(p || q) over the k, d KL / d student_j), each side renormalised over the k."""
    t_norm = math.log(sum(math.exp(x) for x in teacher))
    s_norm = math.log(sum(math.exp(x) for x in student))
    log_p = [x - t_norm for x in teacher]
    log_q = [x - s_norm for x in student]
    kl = sum(math.exp(lp) * (lp - lq) for lp, lq in zip(log_p, log_q, strict=True))
    return kl, [math.exp(lq) - math.exp(lp) for lp, lq in zip(log_p, log_q, strict=True)]


def _hand(name: str, data: dict[str, list], with_is: bool, term: str, coef: float) -> dict[str, list]:
    """Per-token loss, d/d log_prob and d/d student_topk by hand (weights applied)."""
    loss = [[0.0] * T for _ in range(B)]
    d_new = [[0.0] * T for _ in range(B)]
    d_topk = [[[0.0] * K for _ in range(T)] for _ in range(B)]
    for i in range(B):
        for t in range(T):
            w = data["is"][i][t] if with_is else 1.0
            log_ratio = data["delta"][i][t]
            # (weight in the loss, term name)
            parts = [(1.0, "ppo"), (coef, term)] if name == "distillation_ppo" else [(1.0, name)]
            for weight, part in parts:
                if part == "ppo":
                    value, grad = _ppo_token(data["adv"][i][t], log_ratio)
                    d_new[i][t] += weight * w * grad
                elif part == "reverse_kl":
                    value, grad = _ppo_token(data["teacher"][i][t] - data["old"][i][t], log_ratio)
                    d_new[i][t] += weight * w * grad
                else:
                    value, grads = _forward_kl_token(data["t_topk"][i][t], data["s_topk"][i][t])
                    if not data["mask"][i][t]:
                        value, grads = 0.0, [0.0] * K  # off the response: no loss, no gradient
                    for j in range(K):
                        d_topk[i][t][j] += weight * w * grads[j]
                loss[i][t] += weight * w * value
    return {"loss": loss, "d_new": d_new, "d_topk": d_topk}


def _aggregate(values: list[list[float]], mask: list[list[float]], mode: str) -> tuple[float, list[list[float]]]:
    """(sum of the mode's numerator / denominator, the factor each token's loss enters it with)."""
    tokens = sum(sum(row) for row in mask)
    seqs = sum(1 for row in mask if sum(row) > 0)
    factor = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if mask[i][t]:
                factor[i][t] = 1 / tokens if mode == "token-mean" else 1 / (sum(mask[i]) * seqs)
    return sum(values[i][t] * factor[i][t] for i in range(B) for t in range(T)), factor


def _grad_of(tensor: torch.Tensor | None) -> torch.Tensor:
    """The gradient autograd left on a leaf; zeros where the loss never read it."""
    assert tensor is not None
    return tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)


CASES = [
    ("reverse_kl", "reverse_kl"),
    ("forward_kl_topk", "reverse_kl"),
    ("distillation_ppo", "reverse_kl"),
    ("distillation_ppo", "forward_kl_topk"),
]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize(("name", "term"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_distillation_losses_and_gradients_match_the_hand_derivation(
    name: str, term: str, with_is: bool, mode: str, seed: int
) -> None:
    data = _data(seed)
    coef = 0.7
    cfg = PolicyLossConfig(
        policy_loss=name, clip_ratio_high=EPS_HIGH, loss_agg_mode=mode, distill_term=term, distill_coef=coef
    )
    inputs = _inputs(data, with_is)
    per_token, _ = POLICY_LOSSES.get(name)(inputs, cfg)
    numerator, denominator = aggregate_loss(per_token, inputs.response_mask, mode)
    (numerator / denominator).backward()
    numerator, per_token = numerator.detach(), per_token.detach()

    hand = _hand(name, data, with_is, term, coef)
    expected, factor = _aggregate(hand["loss"], data["mask"], mode)
    assert float(numerator / denominator) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    for i in range(B):
        for t in range(T):
            if data["mask"][i][t]:
                assert float(per_token[i, t]) == pytest.approx(hand["loss"][i][t], rel=1e-12, abs=1e-12)
    want_new = [[hand["d_new"][i][t] * factor[i][t] for t in range(T)] for i in range(B)]
    d_new, d_topk = (_grad_of(x) for x in (inputs.log_prob, inputs.student_topk_log_probs))
    for i in range(B):
        assert d_new[i].tolist() == pytest.approx(want_new[i], abs=1e-12)
        for t in range(T):
            want = [g * factor[i][t] for g in hand["d_topk"][i][t]]
            assert d_topk[i, t].tolist() == pytest.approx(want, abs=1e-12)
    assert any(v != 0 for row in want_new for v in row) or any(
        g != 0 for row in hand["d_topk"] for cell in row for g in cell
    )
    assert inputs.teacher_topk_log_probs.grad is None or not inputs.teacher_topk_log_probs.grad.any()


def test_the_teacher_and_student_top_k_are_each_renormalised() -> None:
    # The teacher's top-2 holds 0.3 of its mass as 0.2 : 0.1, the student's 0.06 as 0.04 : 0.02:
    # the same shape, so the renormalised KL is 0 (the raw masses' would not be) and so is its gradient.
    inputs = PolicyLossInputs(
        old_log_prob=torch.zeros(1, 1, dtype=torch.float64),
        log_prob=torch.zeros(1, 1, dtype=torch.float64),
        advantages=torch.zeros(1, 1, dtype=torch.float64),
        response_mask=torch.ones(1, 1, dtype=torch.float64),
        teacher_topk_log_probs=torch.tensor([[[math.log(0.2), math.log(0.1)]]], dtype=torch.float64),
        student_topk_log_probs=torch.tensor([[[math.log(0.04), math.log(0.02)]]], dtype=torch.float64).requires_grad_(),
    )
    loss, metrics = POLICY_LOSSES.get("forward_kl_topk")(inputs, PolicyLossConfig(policy_loss="forward_kl_topk"))
    loss.sum().backward()
    loss = loss.detach()
    assert float(loss) == pytest.approx(0.0, abs=1e-15)
    assert inputs.student_topk_log_probs.grad.abs().max() < 1e-15
    assert float(metrics["distill/forward_kl_topk"]) == pytest.approx(0.0, abs=1e-15)
    # student 0.02 : 0.04 (reversed): KL = 2/3 log 2 + 1/3 log(1/2) = 1/3 log 2 by hand
    inputs.student_topk_log_probs = torch.tensor([[[math.log(0.02), math.log(0.04)]]], dtype=torch.float64)
    loss, _ = POLICY_LOSSES.get("forward_kl_topk")(inputs, PolicyLossConfig(policy_loss="forward_kl_topk"))
    assert float(loss) == pytest.approx(math.log(2) / 3, rel=1e-12)


def test_a_zero_mass_teacher_entry_adds_nothing_and_stays_finite() -> None:
    teacher = torch.tensor([[[math.log(0.5), -math.inf]]], dtype=torch.float64)
    student = torch.tensor([[[math.log(0.3), math.log(0.1)]]], dtype=torch.float64).requires_grad_()
    zeros = torch.zeros(1, 1, dtype=torch.float64)
    inputs = PolicyLossInputs(zeros, zeros, zeros, torch.ones_like(zeros), None, None, teacher, student)
    loss, _ = POLICY_LOSSES.get("forward_kl_topk")(inputs, PolicyLossConfig(policy_loss="forward_kl_topk"))
    loss.sum().backward()
    loss = loss.detach()
    # p = (1, 0), q = (0.75, 0.25): KL = log(1 / 0.75); gradient q - p = (-0.25, 0.25)
    assert float(loss) == pytest.approx(math.log(4 / 3), rel=1e-12)
    assert student.grad[0, 0].tolist() == pytest.approx([-0.25, 0.25], abs=1e-12)


def test_reverse_kl_ignores_the_task_advantages_and_reports_the_kl() -> None:
    data = _data(3)
    cfg = PolicyLossConfig(policy_loss="reverse_kl")
    first, metrics = POLICY_LOSSES.get("reverse_kl")(_inputs(data, False), cfg)
    data["adv"] = [[-x for x in row] for row in data["adv"]]
    second, _ = POLICY_LOSSES.get("reverse_kl")(_inputs(data, False), cfg)
    assert torch.equal(first, second)
    gaps = [data["old"][i][t] - data["teacher"][i][t] for i in range(B) for t in range(T) if data["mask"][i][t]]
    assert float(metrics["distill/reverse_kl"]) == pytest.approx(sum(gaps) / len(gaps), rel=1e-12)
    assert "actor/pg_clipfrac" in metrics


def test_distillation_ppo_reports_the_task_and_the_distillation_statistics() -> None:
    cfg = PolicyLossConfig(policy_loss="distillation_ppo")
    _, metrics = POLICY_LOSSES.get("distillation_ppo")(_inputs(_data(4), False), cfg)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "distill/pg_clipfrac", "distill/reverse_kl"} <= set(metrics)


@pytest.mark.parametrize(("name", "term"), CASES)
def test_a_missing_teacher_field_is_refused_by_name(name: str, term: str) -> None:
    cfg = PolicyLossConfig(policy_loss=name, distill_term=term)
    for field in set(teacher_fields(name, term)) - {TEACHER_TOPK_IDS}:  # the ids reach the engine, not the loss
        inputs = _inputs(_data(5), False)
        setattr(inputs, field, None)
        with pytest.raises(ValueError, match=f"{field}, which this micro-batch lacks .*teacher phase must write it"):
            POLICY_LOSSES.get(name)(inputs, cfg)
    if "forward_kl_topk" in (name, term):
        inputs = _inputs(_data(5), False)
        inputs.student_topk_log_probs = None
        with pytest.raises(ValueError, match="student_topk_log_probs, which .* training engine computes it"):
            POLICY_LOSSES.get(name)(inputs, cfg)


def test_the_distillation_config_is_checked_with_its_dotted_path() -> None:
    assert PolicyLossConfig().distill_term == "reverse_kl" and PolicyLossConfig().distill_coef == 1.0
    for term in DISTILL_TERMS:
        PolicyLossConfig(policy_loss="distillation_ppo", distill_term=term)
    with pytest.raises(ValidationError, match=r"actor.distill_term 'topk' .* allowed: reverse_kl, forward_kl_topk"):
        PolicyLossConfig(distill_term="topk")
    with pytest.raises(ValidationError, match="distill_coef"):
        PolicyLossConfig(distill_coef=-0.1)
    assert set(DISTILL_LOSSES) <= set(POLICY_LOSSES.names())
    assert not POLICY_LOSSES["reverse_kl"].reads_advantages and POLICY_LOSSES["distillation_ppo"].reads_advantages
