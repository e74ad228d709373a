"""The rule rewards' answer extractor, number reader and matches (engines/reward/answers.py, rules.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rl_train.engines.reward.answers import extract_answer, last_boxed, numbers_match, parse_number
from rl_train.engines.reward.base import Trajectory
from rl_train.engines.reward.rules import MathAnswer, NumericMatch, exact_answer


def answer(response: str, truth: str, data_source: str = "math/test") -> Trajectory:
    return Trajectory.of_answer({"prompt": "q", "data_source": data_source, "ground_truth": truth}, response)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),  # empty
        ("I do not know.", None),  # no number at all
        ("The answer is 42.", "42"),  # trailing punctuation
        ("so it is -7!", "-7"),  # negative
        ("about 1.5e3 m", "1.5e3"),  # scientific notation
        ("roughly 2E-4.", "2E-4"),
        ("it costs 1,234,567 dollars", "1,234,567"),  # thousands separators
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # LaTeX fraction in a box
        ("$\\dfrac{3}{4}$", "\\dfrac{3}{4}"),  # \dfrac between $ $, no box
        ("\\boxed{a_{1} + {b}}", "a_{1} + {b}"),  # nested braces
        ("first \\boxed{12}, finally \\boxed{13}.", "13"),  # several boxes: the last
        ("\\boxed 5", "5"),  # a box without braces
        ("the answer: $\\boxed{-3}$.", "-3"),
        ("\\boxed{7", "7"),  # an unclosed box is no box: the last number instead
        ("steps 3 then 4\n#### 1,000.\nbye 9", "1,000"),  # GSM8K: after the last ####
        ("#### $12$", "12"),
        ("####", None),  # an empty #### line and no number
        ("so 3/4 of it", "3/4"),
        ("value: .5", ".5"),
        ("\\boxed{\\text{yes}}", "yes"),
    ],
)
def test_extract_answer_edge_cases(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_a_box_wins_over_hashes_and_numbers_and_hashes_over_the_last_number() -> None:
    assert extract_answer("#### 5 and \\boxed{6} then 7") == "6"
    assert extract_answer("#### 5\n then 7") == "5"
    assert last_boxed("no box here") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-42", Fraction(-42)),
        ("+3", Fraction(3)),
        ("\u22123", Fraction(-3)),  # the Unicode minus
        ("1,234", Fraction(1234)),
        ("1,234.50", Fraction(123450, 100)),
        ("0.1", Fraction(1, 10)),  # exact, not the float 0.1
        (".5", Fraction(1, 2)),
        ("1e-3", Fraction(1, 1000)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{1}{3}", Fraction(1, 3)),
        ("-\\dfrac{6}{4}", Fraction(-3, 2)),
        ("\\tfrac{2}{0.5}", Fraction(4)),
        ("$7$.", Fraction(7)),
    ],
)
def test_parse_number_reads_exact_values(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "1,2", "12,34", "1/0", "\\frac{1}{0}", "--3", "3x", "e5", ".", "1e401", "1e-99999999999"]
)
def test_parse_number_refuses_what_is_not_one_number(text: str) -> None:
    assert parse_number(text) is None


def test_numbers_match_exact_and_within_tolerances() -> None:
    assert numbers_match(Fraction(1, 10) + Fraction(2, 10), Fraction(3, 10), rel_tol=0, abs_tol=0)
    assert not numbers_match(Fraction(1, 3), Fraction(333, 1000), rel_tol=1e-6, abs_tol=0)
    # |1/3 - 0.333| = 3.3e-4 <= abs_tol 1e-3
    assert numbers_match(Fraction(1, 3), Fraction(333, 1000), rel_tol=0, abs_tol=1e-3)
    # relative: |100 - 100.001| / 100.001 = 1e-5 <= 1e-4
    assert numbers_match(100.0, 100.001, rel_tol=1e-4, abs_tol=0)
    assert not numbers_match(-5.0, 5.0, rel_tol=1e-6, abs_tol=1e-9)


def test_exact_answer_is_the_arith_reward_unchanged() -> None:
    """The built-in task's scores: the whole response, blanks around it ignored, must be the answer."""
    assert exact_answer(answer(" 12 ", "12")).score == 1.0
    assert exact_answer(answer("12.", "12")).score == 0.0  # exact, not numeric
    assert exact_answer(answer("012", "12")).score == 0.0
    assert exact_answer(answer("", "12")).score == 0.0
    assert exact_answer(answer("12", "12")).sub_scores == {}


def test_numeric_match_takes_the_last_number() -> None:
    numeric = NumericMatch(rel_tol=1e-6, abs_tol=1e-9)
    assert numeric(answer("I think 3, no: 1,000.", "1000")).score == 1.0
    assert numeric(answer("-0.50", "-1/2")).score == 1.0
    assert numeric(answer("1000.1", "1000")).score == 0.0
    assert numeric(answer("none", "1000")).score == 0.0


def test_math_answer_compares_the_extracted_answer_and_reports_whether_one_was_found() -> None:
    math = MathAnswer(rel_tol=1e-6, abs_tol=1e-9)
    right = math(answer("So x = 2 and the result is \\boxed{\\frac{3}{2}}.", "1.5"))
    assert (right.score, right.sub_scores) == (1.0, {"answer_found": 1.0})
    assert math(answer("Work: 5 + 7\n#### 12", "12")).score == 1.0
    wrong = math(answer("\\boxed{12} but also 13", "13"))  # the box is the answer, not the last number
    assert (wrong.score, wrong.sub_scores) == (0.0, {"answer_found": 1.0})
    missing = math(answer("no idea", "13"))
    assert (missing.score, missing.sub_scores) == (0.0, {"answer_found": 0.0})
    assert math(answer("\\boxed{\\text{yes}}", "yes")).score == 1.0  # not numbers: compared as text
