"""The gateway-agents bench runs the calculator agent both ways and prints their ratio."""

from __future__ import annotations

import re

import pytest

from rl_train.bench.gateway_agents import main


def test_the_bench_times_both_modes_and_prints_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--agents", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"repeat 0 in_process +\d+\.\d\d s", out) and re.search(r"repeat 0 process +\d+\.\d\d s", out)
    assert re.search(r"process / in-process: \d+\.\d\dx; -?\d+\.\d{3} s more per agent", out), out
