"""JSON from outside the trainer (an agent's request, a tool call's arguments), parsed so that
no input of any shape can raise anything but ``UnsafeJson`` (a ``ValueError``).

``json.loads`` alone has three ways to fail that are not ``JSONDecodeError``: nesting deeper than
the recursion limit (``RecursionError``: a hundred thousand ``[``), an integer of more than
4,300 digits (Python's int-string limit, a ``ValueError``), and strings that are not valid
Unicode (``"\\ud800"`` parses, but no encoder downstream takes it). It also accepts ``NaN`` and
``Infinity``, which JSON does not have, and turns ``1e999`` into ``inf``. Here the depth is
measured before parsing, linearly and without recursion; integers beyond int64 are refused
before they are converted; non-finite numbers and lone surrogates are refused.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted: a chat request needs five or six levels, a
tool's JSON-schema parameters a dozen or so."""

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT64_DIGITS = len(str(INT64_MAX))
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
"""A JSON string literal (escapes included): removed before the brackets are counted."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class UnsafeJson(ValueError):
    """Text that is not JSON, or JSON this process does not accept; the message says why."""


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text``; linear, no recursion. Brackets inside
    string literals do not count; an unterminated string leaves its brackets counted, which can
    only overstate the depth of text that is not JSON anyway."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > INT64_DIGITS or not INT64_MIN <= (value := int(digits)) <= INT64_MAX:
        raise UnsafeJson(f"an integer beyond 64 bits ({len(digits)} characters); allowed: {INT64_MIN} to {INT64_MAX}")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJson(f"a number beyond a 64-bit float ({text[:40]})")
    return value


def _no_constant(name: str) -> Any:
    raise UnsafeJson(f"{name} is not JSON")


def loads_bounded(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` as JSON, or ``UnsafeJson`` naming what is wrong with it."""
    depth = json_depth(text)
    if depth > max_depth:
        raise UnsafeJson(f"nested {depth} levels deep; allowed: at most {max_depth}")
    try:
        value = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
    except UnsafeJson:
        raise
    except json.JSONDecodeError as error:
        raise UnsafeJson(f"not JSON: {error.msg} at character {error.pos}") from None
    except (ValueError, RecursionError) as error:  # anything the parser itself gives up on
        raise UnsafeJson(f"not accepted JSON: {error}") from None
    _check_strings(value)
    return value


def _check_strings(value: Any) -> None:
    """Every string, key or value, is encodable Unicode; an explicit stack, no recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise UnsafeJson("a string that is not valid Unicode (a lone surrogate)") from None
