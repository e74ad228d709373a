"""Tools of the agent loop: arguments checked against their schema, failures as observations,
and the Python sandbox's limits (a time bomb, a memory bomb, a network attempt, a process,
an output flood), each contained."""

from __future__ import annotations

import time

import pytest

from rl_train.engines.agent.tools import TOOLS, long_tail_seconds, run_tool
from rl_train.engines.sandbox import Limits, run_python


def test_the_built_in_tools_are_registered() -> None:
    assert {"calculator", "python", "long_tail"} <= set(TOOLS.names())


@pytest.mark.parametrize(
    ("expression", "value"),
    [("12+30", "42"), ("(2+3)*4", "20"), ("7/2", "3.5"), ("-3**2", "-9"), ("2**10 % 1000", "24"), ("9 // 2", "4")],
)
def test_the_calculator_computes(expression: str, value: str) -> None:
    result = run_tool("calculator", {"expression": expression}, 1.0)
    assert (result.text, result.error) == (value, False)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"expression": "__import__('os').system('true')"}, "Call is not allowed"),
        ({"expression": "1/0"}, "division by zero"),
        ({"expression": "9**9**9"}, "exponent"),
        ({"expression": "1 +"}, "not an arithmetic expression"),
        ({"expr": "1+1"}, "'expression' is a required property"),
        ({"expression": 5}, "expression: 5 is not of type 'string'"),
    ],
)
def test_bad_calculator_calls_are_error_observations(arguments: dict, message: str) -> None:
    result = run_tool("calculator", arguments, 1.0)
    assert result.error and message in result.text, result.text


def test_an_unknown_tool_is_an_error_observation_naming_the_tools() -> None:
    result = run_tool("rm", {}, 1.0)
    assert result.error and "unknown tool 'rm'; available:" in result.text and "calculator" in result.text


def test_python_prints() -> None:
    result = run_tool("python", {"code": "print(sum(range(10)))"}, 5.0)
    assert (result.text.strip(), result.error) == ("45", False)


def test_a_time_bomb_is_killed_at_the_time_limit() -> None:
    started = time.perf_counter()
    result = run_python("while True:\n    pass", Limits(wall_s=1.0))
    assert result.timed_out and "[killed: time limit]" in result.observation()
    assert time.perf_counter() - started < 10


def test_a_memory_bomb_fails_inside_the_program() -> None:
    result = run_python("x = bytearray(4 * 1024**3)\nprint('allocated')", Limits(wall_s=5.0, memory_mb=256))
    assert "allocated" not in result.stdout and "MemoryError" in result.stderr and result.exit_code != 0


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)",
        "import subprocess\nsubprocess.run(['curl', 'http://example.com'])",
        "import os\nos.system('echo escaped')",
        "import ctypes\nctypes.CDLL(None)",
    ],
)
def test_network_and_processes_are_refused(code: str) -> None:
    result = run_python(code, Limits(wall_s=5.0))
    assert "sandbox:" in result.stderr and "not allowed" in result.stderr, result
    assert "escaped" not in result.stdout


def test_an_output_flood_is_cut() -> None:
    result = run_python("print('x' * 100000)", Limits(wall_s=5.0), max_output_bytes=1000)
    assert result.truncated and len(result.stdout) == 1000 and "[output truncated]" in result.observation()


def test_long_tail_delays_are_heavy_tailed_and_repeatable() -> None:
    delays = [long_tail_seconds(f"call-{i}", 0.2, 1.4, 60.0) for i in range(2000)]
    ordered = sorted(delays)
    assert 0.15 < ordered[1000] < 0.27  # the median
    assert ordered[1980] / ordered[1000] > 10  # p99 / p50 of a lognormal with sigma 1.4 is ~26
    assert long_tail_seconds("call-7", 0.2, 1.4, 60.0) == delays[7]
    slow = run_tool("long_tail", {"query": "q", "median_s": 5.0, "sigma": 0.0}, 0.2)
    assert slow.error and "no answer within 0.2 s" in slow.text


def test_a_tool_call_does_not_check_the_schema_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema is checked once, when the tool is made; a call only validates its
    arguments (checking the schema every call was 6% of a rollout replica's samples under a sampling profiler)."""
    import jsonschema

    checks: list[object] = []
    real = jsonschema.Draft202012Validator.check_schema
    monkeypatch.setattr(
        jsonschema.Draft202012Validator, "check_schema", classmethod(lambda cls, s: checks.append(s) or real(s))
    )
    assert run_tool("calculator", {"expression": "2+3"}, 1.0).text == "5"
    assert run_tool("calculator", {"expression": 5}, 1.0).error
    assert checks == []
