"""JSON from outside the trainer (an agent's request, a tool call's arguments), parsed so that
no input of any shape can raise anything but ``UnsafeJson`` (a ``ValueError``).

``json.loads`` alone has three ways to fail that are not ``JSONDecodeError``: nesting deeper than
the recursion limit (``RecursionError``: a hundred thousand ``[``), an integer of more than
4,300 digits (Python's int-string limit, a ``ValueError``), and strings that are not valid
Unicode (``"\\ud800"`` parses, but no encoder downstream takes it). It also accepts ``NaN`` and
``Infinity``, which JSON does not have, and turns ``1e999`` into ``inf``. Here the parser's own
recursion guard and its int-string limit (Python 3.10.7 and later refuse to convert more than
4,300 digits, the conversion being quadratic) are caught, the two words are refused, and the
parsed value is then walked once, a level at a time without recursion, for its depth, its
numbers (integers within int64, floats finite) and its strings. (Measuring the depth on the
text before parsing would need a scanner of string literals: a regular expression for them
backtracks quadratically on runs of ``\\"``, and the C parser is linear.)
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted: a chat request needs five or six levels, a
tool's JSON-schema parameters a dozen or so."""

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT64_DIGITS = len(str(INT64_MAX))


class UnsafeJson(ValueError):
    """Text that is not JSON, or JSON this process does not accept; the message says why."""


def _no_constant(name: str) -> Any:
    raise UnsafeJson(f"{name} is not JSON")


def loads_bounded(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` as JSON, or ``UnsafeJson`` naming what is wrong with it."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except UnsafeJson:
        raise
    except json.JSONDecodeError as error:
        raise UnsafeJson(f"not JSON: {error.msg} at character {error.pos}") from None
    except RecursionError:
        raise UnsafeJson(f"nested deeper than the parser's recursion limit; allowed: at most {max_depth} levels") from None
    except ValueError as error:  # an integer past Python's int-string limit, or anything else the parser gives up on
        raise UnsafeJson(f"not accepted JSON: {error}") from None
    _check_parsed(value, max_depth)
    return value


def _check_parsed(value: Any, max_depth: int) -> None:
    """Arrays and objects nest at most ``max_depth`` deep; every integer fits int64, every
    float is finite, every string (key or value) is encodable Unicode. One walk, a level at a
    time, no recursion: each level is a list, checked by comprehensions."""
    level = [value]
    for depth in range(max_depth + 1):
        if any(type(x) is int and not INT64_MIN <= x <= INT64_MAX for x in level):
            raise UnsafeJson(f"an integer beyond 64 bits; allowed: {INT64_MIN} to {INT64_MAX}")
        if any(type(x) is float and not math.isfinite(x) for x in level):
            raise UnsafeJson("a number beyond a 64-bit float")
        if any(type(x) is str and not x.isascii() and not _encodable(x) for x in level):
            raise UnsafeJson("a string that is not valid Unicode (a lone surrogate)")
        containers = [x for x in level if type(x) is dict or type(x) is list]
        if not containers:
            return
        if depth == max_depth:
            raise UnsafeJson(f"nested more than {max_depth} levels deep; allowed: at most {max_depth}")
        level = []
        for container in containers:
            if type(container) is dict:
                level += container.keys()
                level += container.values()
            else:
                level += container


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
