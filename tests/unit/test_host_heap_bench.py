"""The heap bench runs each side in its own interpreter and reports medians and ratios."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.bench.host_heap import format_table, main


def test_table_gives_medians_and_each_rounds_own_ratio() -> None:
    rounds = [
        {"kept": {"forward": (0.040, 0.0), "update": (0.100, 10.0)}, "default": {"forward": (0.050, 8000.0), "update": (0.100, 20.0)}},
        {"kept": {"forward": (0.060, 2.0), "update": (0.120, 10.0)}, "default": {"forward": (0.060, 9000.0), "update": (0.150, 30.0)}},
        {"kept": {"forward": (0.045, 1.0), "update": (0.110, 12.0)}, "default": {"forward": (0.090, 7000.0), "update": (0.110, 20.0)}},
    ]
    lines = format_table(rounds).splitlines()
    # forward: medians 45 ms / 60 ms = 0.75x; rounds 0.8, 1.0, 0.5 -> median 0.80
    assert lines[2] == "| forward | 45.0 / 1 | 60.0 / 8,000 | 0.75x | 0.80x (0.50-1.00) |"
    # update: medians 110 / 110 ms; rounds 1.0, 0.8, 1.0
    assert lines[3] == "| update | 110.0 / 10 | 110.0 / 20 | 1.00x | 1.00x (0.80-1.00) |"


def test_a_small_run_measures_both_sides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--model", str(tmp_path / "missing"), "--rows", "2", "--passes", "1", "--rounds", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("2 x 130 tokens, 1 thread, 1 passes each, medians of 1 rounds")
    assert [line.split(" | ")[0] for line in out[-2:]] == ["| forward", "| update"]
