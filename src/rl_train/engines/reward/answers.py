"""Reading a final answer out of a response, and numbers out of answers, for the rule rewards.

``extract_answer`` tries, in order, the styles models are trained to: the last ``\\boxed{...}``
(braces nested to any depth; ``\\boxed 5`` without braces too), the text after the last
``####`` (GSM8K), then the last number in the text. ``parse_number`` reads what graders meet in
ground truths and answers: signs (``-``, ``+``, the Unicode minus), thousands separators
(``1,234``, only in groups of three, so that ``1,2`` is not 12), decimals (``.5``), scientific
notation (``1e-3``), fractions ``3/4`` and LaTeX ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\tfrac``, wrapped
in ``$...$`` or not, trailing punctuation ignored. Exact values stay exact (``Fraction``), so
``0.1 + 0.2`` style float noise never decides a match between two exact numbers.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_EXPONENT = 400
"""Scientific notation past this exponent is no number (a float's range ends near 1e308)."""
TRAILING = " \t\n.,;:!?"
"""Punctuation a sentence puts after an answer ("the answer is 42.")."""

_NUMBER = r"[-+\u2212]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_FRAC = r"[-+\u2212]?\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}"
_NUMBER_IN_TEXT = re.compile(
    rf"{_FRAC}|[-+\u2212]?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|[-+\u2212]?\.\d+"
)
_FRAC_PARTS = re.compile(r"^([-+]?)\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}$")
_PLAIN = re.compile(rf"^{_NUMBER}$")


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at ``text[start]``, nested braces kept; None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\boxed x``, ``\\fbox{...}``) in ``text``."""
    found = None
    for command in BOX_COMMANDS:
        at = text.rfind(command)
        if at >= 0 and (found is None or at > found[0]):
            found = (at, command)
    if found is None:
        return None
    rest_at = found[0] + len(found[1])
    rest = text[rest_at:]
    if rest.startswith("{"):
        return _braced(text, rest_at)
    if rest[:1].isspace():  # \boxed 5: one token
        token = rest.split(maxsplit=1)
        return token[0].rstrip("$") if token else None
    return None


def after_hashes(text: str) -> str | None:
    """GSM8K style: the rest of the line after the last ``####``."""
    at = text.rfind("####")
    if at < 0:
        return None
    return text[at + 4 :].split("\n", 1)[0].strip() or None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (a fraction ``a/b`` or ``\\frac{a}{b}`` counts as one)."""
    found = _NUMBER_IN_TEXT.findall(text)
    return found[-1] if found else None


def clean_answer(answer: str) -> str:
    """An extracted answer without its wrapping: blanks, ``$...$``, ``\\text{}``, ``\\!`` and
    trailing punctuation."""
    answer = answer.strip().strip("$").strip()
    answer = re.sub(r"\\text\{([^{}]*)\}", r"\1", answer).replace("\\!", "").replace("\\,", "")
    return answer.rstrip(TRAILING).strip().strip("$").strip()


def extract_answer(text: str) -> str | None:
    """The response's final answer, by the first style it uses: last box, ``####``, last number.

    None when it has none of them (an empty response, or one without a number)."""
    for style in (last_boxed, after_hashes):
        found = style(text)
        if found is not None and clean_answer(found):
            return clean_answer(found)
    found = last_number(text)
    return clean_answer(found) if found is not None else None


def parse_number(text: str) -> Fraction | float | None:
    """``text`` as a number (exact where it is written exactly), or None if it is not one."""
    text = clean_answer(text).replace("\u2212", "-").replace(" ", "")
    if not text:
        return None
    frac = _FRAC_PARTS.match(text)
    if frac:
        sign, top, bottom = frac.groups()
        value = _ratio(top, bottom)
        return -value if value is not None and sign == "-" else value
    if text.count("/") == 1:
        return _ratio(*text.split("/"))
    if not _PLAIN.match(text) or not any(c.isdigit() for c in text):
        return None
    plain = text.replace(",", "")
    exponent = re.search(r"[eE][-+]?0*(\d*)$", plain)
    if exponent and (len(exponent.group(1)) > 3 or int(exponent.group(1) or 0) > MAX_EXPONENT):
        return None  # past any float, and an exact 10**huge would stall the worker
    try:
        return Fraction(plain)  # exact: integers, decimals, and 1e-3 too
    except (ValueError, ZeroDivisionError):
        value = float(plain)
        return value if math.isfinite(value) else None


def _ratio(top: str, bottom: str) -> Fraction | float | None:
    """``top / bottom``, exact when both are; None when either is not a number or bottom is 0."""
    num, den = parse_number(top), parse_number(bottom)
    if num is None or den is None or den == 0:
        return None
    if isinstance(num, Fraction) and isinstance(den, Fraction):
        return num / den
    return float(num) / float(den)


def numbers_match(a: Fraction | float, b: Fraction | float, rel_tol: float, abs_tol: float) -> bool:
    """Equal when both are exact, else within ``rel_tol`` (relative) or ``abs_tol`` (absolute)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction) and a == b:
        return True
    return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
