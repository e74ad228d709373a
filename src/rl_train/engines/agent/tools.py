"""Tools the policy can call: the ``TOOLS`` table of named tools, each with JSON-schema arguments.

A call is ``run_tool(name, arguments, timeout_s)``. It never raises for the caller's mistakes
or the tool's failures: an unknown tool, arguments that do not match the schema, a tool that
crashes or runs out of time each come back as a ``ToolResult`` with ``error`` set and a message
the model can read (the loop feeds it back as an observation). Built in:

- ``calculator``: an arithmetic expression (numbers, + - * / // % **, parentheses), evaluated
  on its syntax tree, never by ``eval``; exponents and results are bounded.
- ``python``: a program run in a sandbox (``rl_train.engines.sandbox.run_python``, under
  the ``sandbox`` config): its own namespaces, a read-only root, time, memory, process, file
  and output limits, no network. Where no sandbox can start it is an error observation,
  unless ``sandbox.allow_unsandboxed``.
- ``long_tail``: answers after a heavy-tailed (lognormal) delay, the same for the same call:
  the latency of a real sandbox, for benchmarks of the async modes.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from rl_train.engines.sandbox import SandboxConfig, SandboxUnavailable, run_python
from rl_train.registry import Registry


@dataclass
class ToolResult:
    text: str
    """What the model reads as the observation."""
    error: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    run: Callable[[dict[str, Any], float, SandboxConfig], str]
    """(arguments, timeout in seconds, the sandbox config) -> the answer; raises ``ToolError``
    for a failure the model should read."""
    validator: jsonschema.Draft202012Validator = field(init=False, repr=False, compare=False)
    """The arguments' validator, its schema checked once, when the tool is made
    (``jsonschema.validate`` checks the schema itself again at every call: 6% of a rollout
    replica's samples on the tool task, under a sampling profiler)."""

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        object.__setattr__(self, "validator", jsonschema.Draft202012Validator(self.parameters))


class ToolError(Exception):
    """A tool's failure, worded for the model (bad input, a limit hit)."""


def run_tool(name: str, arguments: Any, timeout_s: float, sandbox: SandboxConfig | None = None) -> ToolResult:
    """``sandbox``: how the python tool runs its code (None: the defaults, sandbox required)."""
    started = time.perf_counter()

    def failed(message: str) -> ToolResult:
        return ToolResult(f"error: {message}", True, time.perf_counter() - started)

    if name not in TOOLS:
        return failed(f"unknown tool {name!r}; available: {', '.join(TOOLS.names())}")
    tool = TOOLS[name]
    error = jsonschema.exceptions.best_match(tool.validator.iter_errors(arguments))
    if error is not None:  # the error jsonschema.validate would raise
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return failed(f"{name}: {where}: {error.message}")
    try:
        text = tool.run(arguments, timeout_s, sandbox or SandboxConfig())
    except ToolError as error:
        return failed(f"{name}: {error}")
    except Exception as error:  # a tool's own bug is the model's observation, not the loop's crash
        return failed(f"{name} failed: {type(error).__name__}: {error}")
    return ToolResult(text, False, time.perf_counter() - started)


# -- calculator ---------------------------------------------------------------------------
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or ``ToolError`` naming what is not allowed."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ToolError(f"exponent {right} is larger than {MAX_EXPONENT}")
            try:
                result = BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            if isinstance(result, complex) or (isinstance(result, float) and not math.isfinite(result)):
                raise ToolError("the result is not a finite real number")
            if abs(result) > MAX_MAGNITUDE:
                raise ToolError(f"the result is larger than {MAX_MAGNITUDE:.0e}")
            return result
        raise ToolError(f"{type(node).__name__} is not allowed (numbers, + - * / // % ** and parentheses only)")

    return value(tree.body)


def _calculator(arguments: dict[str, Any], timeout_s: float, sandbox: SandboxConfig) -> str:
    result = evaluate(arguments["expression"])
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


CALCULATOR = Tool(
    "calculator",
    "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "maxLength": 1000}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    _calculator,
)


# -- python -------------------------------------------------------------------------------
def _python(arguments: dict[str, Any], timeout_s: float, sandbox: SandboxConfig) -> str:
    try:
        result = run_python(
            arguments["code"], sandbox.tool_limits(timeout_s), max_output_bytes=sandbox.max_output_bytes,
            allow_unsandboxed=sandbox.allow_unsandboxed,
        )  # fmt: skip
    except SandboxUnavailable as error:
        raise ToolError(str(error)) from None
    return result.observation()


PYTHON = Tool(
    "python",
    "Run a Python program and read what it prints (no network, limited time and memory).",
    {
        "type": "object",
        "properties": {"code": {"type": "string", "maxLength": 20000}},
        "required": ["code"],
        "additionalProperties": False,
    },
    _python,
)


# -- long_tail ----------------------------------------------------------------------------
def long_tail_seconds(key: str, median_s: float, sigma: float, max_s: float) -> float:
    """A lognormal delay drawn from ``key`` alone: the same call waits the same time."""
    digest = hashlib.sha256(key.encode()).digest()
    u1 = (int.from_bytes(digest[:8], "big") + 1) / 2.0**64
    u2 = int.from_bytes(digest[8:16], "big") / 2.0**64
    normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return min(median_s * math.exp(sigma * normal), max_s)


def _long_tail(arguments: dict[str, Any], timeout_s: float, sandbox: SandboxConfig) -> str:
    delay = long_tail_seconds(
        arguments["query"],
        arguments.get("median_s", 0.2),
        arguments.get("sigma", 1.4),
        arguments.get("max_s", 60.0),
    )
    if delay > timeout_s:
        time.sleep(timeout_s)
        raise ToolError(f"no answer within {timeout_s:g} s")
    time.sleep(delay)
    return f"result for {arguments['query']!r} after {delay:.3f} s"


LONG_TAIL = Tool(
    "long_tail",
    "Look something up; answers after a heavy-tailed delay (a stand-in for a slow sandbox).",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 1000},
            "median_s": {"type": "number", "exclusiveMinimum": 0},
            "sigma": {"type": "number", "minimum": 0},
            "max_s": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    _long_tail,
)


TOOLS: Registry[Tool] = Registry(
    "tool",
    "a tool call's name (the tool_agent loop)",
    {tool.name: tool for tool in (CALCULATOR, PYTHON, LONG_TAIL)},
)
