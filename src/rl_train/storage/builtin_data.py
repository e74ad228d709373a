"""Built-in verifiable tasks, written as Parquet train/val splits.

- ``single_digit_sum``: "3+4=" -> "7". Only 100 distinct problems exist, so the train split
  samples them with replacement and the val split is all 100 once: validation measures
  whether the policy has learned the table, not generalisation.
- ``multi_digit_sum``: "37+85=" -> "122", operands of 1..``digits`` digits; val problems are
  drawn apart from train ones.
- ``tool_sum``: "345+678=" -> "1023" with three-digit operands, which the tiny policy cannot
  add by itself: each row names the ``tool_agent`` loop (``agent_name``), so the policy is
  answered by the calculator tool when it calls it, and is scored on its last turn.
- ``tiny_function``: a code task. The prompt is the start of a Python function after two
  examples of it, ``#f(1)==5,f(2)==6\ndef f(x):return ``, and the policy writes the body's
  expression (``x+4``, or ``4+x``: any code that passes). The row's ``tests`` are asserts at the
  two examples and two other points, run by the ``code_tests`` reward in the sandbox on the
  prompt followed by the response (``reward.code_tests.prefix_field: prompt``, as
  ``configs/code-tiny.yaml`` sets it). The functions are ``x+d``, ``x-d`` and ``x*d`` for d in
  2..9: 24 of them, each told apart by its two examples; like ``single_digit_sum``, train
  samples them with replacement and val is each once.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rl_train.registry import Entry, Registry

Row = dict[str, str]


def _row(a: int, b: int, source: str) -> Row:
    return {"prompt": f"{a}+{b}=", "data_source": source, "ground_truth": str(a + b)}


TOOL_SUM_SOURCE = "arith/tool_sum"


def single_digit_sum(num_train: int = 2000, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Sums of two digits ("3+4=" -> "7"); val is each of the 100 once: has the table been learned?"""
    rng = random.Random(seed)
    train = [_row(rng.randint(0, 9), rng.randint(0, 9), "arith/single_digit_sum") for _ in range(num_train)]
    val = [_row(a, b, "arith/single_digit_sum") for a in range(10) for b in range(10)]
    return train, val


def multi_digit_sum(
    num_train: int = 4000, num_val: int = 200, digits: int = 2, seed: int = 0
) -> tuple[list[Row], list[Row]]:
    """Sums of numbers of 1..``digits`` digits ("37+85=" -> "122"); val problems are apart from train ones."""
    rng = random.Random(seed)
    high = 10**digits - 1
    val_pairs: set[tuple[int, int]] = set()
    while len(val_pairs) < num_val:
        val_pairs.add((rng.randint(0, high), rng.randint(0, high)))
    train: list[Row] = []
    while len(train) < num_train:
        pair = (rng.randint(0, high), rng.randint(0, high))
        if pair not in val_pairs:
            train.append(_row(*pair, "arith/multi_digit_sum"))
    return train, [_row(a, b, "arith/multi_digit_sum") for a, b in sorted(val_pairs)]


def tool_sum(num_train: int = 4000, num_val: int = 200, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Sums of three-digit numbers ("345+678=" -> "1023"), each row answered by the tool_agent loop."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < num_train + num_val:
        pair = (rng.randint(100, 999), rng.randint(100, 999))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    rows = [{**_row(a, b, TOOL_SUM_SOURCE), "agent_name": "tool_agent"} for a, b in pairs]
    return rows[:num_train], rows[num_train:]


TINY_FUNCTION_SOURCE = "code_tests/tiny_function"
"""Routed to the ``code_tests`` reward by its prefix."""
TINY_FUNCTION_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
TINY_FUNCTION_CONSTANTS = range(2, 10)
"""From 2: ``x+1`` and ``x*2`` (like ``x+0`` and ``x*1``) would share their examples."""
TINY_FUNCTION_CHECKS = (1, 2, 7, -4)
"""Where the tests call the function: the prompt's two examples, then two points it does not show."""


def tiny_function_prompt(op: str, constant: int) -> str:
    """The prompt of ``x<op><constant>``: its values at 1 and 2, then the function up to its body."""
    first, second = (TINY_FUNCTION_OPS[op](x, constant) for x in TINY_FUNCTION_CHECKS[:2])
    return f"#f(1)=={first},f(2)=={second}\ndef f(x):return "


def _function_row(op: str, constant: int) -> dict[str, object]:
    tests = [f"assert f({x})=={TINY_FUNCTION_OPS[op](x, constant)}" for x in TINY_FUNCTION_CHECKS]
    prompt = tiny_function_prompt(op, constant)
    return {"prompt": prompt, "data_source": TINY_FUNCTION_SOURCE, "ground_truth": f"x{op}{constant}", "tests": tests}


def tiny_function(num_train: int = 2000, seed: int = 0) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Write ``f``'s body from two of its values (``#f(1)==5,f(2)==6 ... return `` -> ``x+4``),
    judged by unit tests in the sandbox; val is each of the 24 functions once."""
    rng = random.Random(seed)
    functions = [(op, constant) for op in TINY_FUNCTION_OPS for constant in TINY_FUNCTION_CONSTANTS]
    train = [_function_row(*rng.choice(functions)) for _ in range(num_train)]
    return train, [_function_row(*function) for function in functions]


BUILTIN_TASKS: Registry[Entry[Callable[..., tuple[list[Any], list[Any]]]]] = Registry(
    "built-in task",
    "data.builtin_task",
    {
        "single_digit_sum": Entry(single_digit_sum),
        "multi_digit_sum": Entry(multi_digit_sum),
        "tool_sum": Entry(tool_sum),
        "tiny_function": Entry(tiny_function),
    },
)


def write_builtin_task(name: str, out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of a built-in task; returns their paths."""
    train, val = BUILTIN_TASKS.get(name)(seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.parquet", out / "val.parquet"
    for rows, path in zip((train, val), paths, strict=True):
        pq.write_table(pa.Table.from_pylist(rows), path)
    return paths
