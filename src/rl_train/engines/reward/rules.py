"""Rule-based rewards (R-6.1): exact, numeric and math answer matching, on the CPU.

``exact_answer`` is the built-in arithmetic task's reward, unchanged: the response up to end of
sequence, surrounding blanks ignored, must be the ground truth (its score on every answer is
what it always was, so that runs and their resumes are unchanged). ``NumericMatch`` and
``MathAnswer`` compare numbers within ``reward.numeric``'s tolerances; ``MathAnswer`` first
extracts the final answer (``answers.extract_answer``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_train.engines.reward.answers import (
    clean_answer,
    extract_answer,
    last_number,
    numbers_match,
    parse_number,
)
from rl_train.engines.reward.base import RewardResult, Trajectory

if TYPE_CHECKING:
    from rl_train.engines.reward.config import RewardSettings


def exact_answer(trajectory: Trajectory) -> RewardResult:
    """1 if the response (up to end of sequence, surrounding blanks ignored) is the answer, else 0."""
    return RewardResult(1.0 if trajectory.response.strip() == trajectory.ground_truth.strip() else 0.0)


def _same_answer(answer: str | None, truth: str, rel_tol: float, abs_tol: float) -> bool:
    """Numerically equal when both read as numbers, else equal as cleaned text."""
    if answer is None:
        return False
    got, want = parse_number(answer), parse_number(truth)
    if got is not None and want is not None:
        return numbers_match(got, want, rel_tol, abs_tol)
    return clean_answer(answer) == clean_answer(truth)


class NumericMatch:
    """1 if the last number of the response equals the ground truth within the tolerances
    (``reward.numeric``), else 0."""

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> None:
        self.rel_tol, self.abs_tol = rel_tol, abs_tol

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> NumericMatch:
        return cls(settings.reward.numeric.rel_tol, settings.reward.numeric.abs_tol)

    def __call__(self, trajectory: Trajectory) -> RewardResult:
        answer = last_number(trajectory.response)
        return RewardResult(1.0 if _same_answer(answer, trajectory.ground_truth, self.rel_tol, self.abs_tol) else 0.0)


class MathAnswer(NumericMatch):
    """1 if the final answer (last ``\\boxed{}``, else after ``####``, else the last number)
    equals the ground truth (as numbers within ``reward.numeric``'s tolerances, else as text);
    sub-score ``answer_found``: the response states an answer at all."""

    def __call__(self, trajectory: Trajectory) -> RewardResult:
        answer = extract_answer(trajectory.response)
        correct = _same_answer(answer, trajectory.ground_truth, self.rel_tol, self.abs_tol)
        return RewardResult(1.0 if correct else 0.0, {"answer_found": 0.0 if answer is None else 1.0})
