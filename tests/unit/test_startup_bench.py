"""The start-up bench times what it says: a resumed variant resumes one run, a step more each
time, and only the runs through Prefect get the server started for them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from rl_train.bench import startup
from rl_train.bench.startup import Variant, parse_variant, run_once

LINE = "start-up (s from process start): config 0.20, ray 3.10, first_step 7.50"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(command: list[str], env: dict[str, str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append((command, env))
        return subprocess.CompletedProcess(command, 0, "", f"step    1/1 | ...\n{LINE}\n")

    monkeypatch.setattr(startup.subprocess, "run", fake_run)
    return seen


def test_a_resumed_variant_trains_its_run_one_step_more_each_time(calls: list[Any], tmp_path: Path) -> None:
    variant = Variant("resume", resume=True, steps_done=1, run_name="resume-0")
    for index in range(2):
        run_once(variant, "demo.yaml", tmp_path, index, api_url="http://127.0.0.1:1/api")
    (first, env), (second, _) = calls
    assert "run.name=resume-0" in first and "run.name=resume-0" in second
    assert "trainer.total_steps=2" in first and "trainer.total_steps=3" in second
    assert "checkpoint.every_steps=1" in first and "--no-prefect" not in first
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:1/api"
    assert variant.marks == [{"config": 0.2, "ray": 3.1, "first_step": 7.5}] * 2


def test_a_fresh_run_without_prefect_gets_no_server(calls: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    run_once(Variant("fresh", prefect=False), "demo.yaml", tmp_path, 4, api_url="http://127.0.0.1:1/api")
    ((command, env),) = calls
    assert "--no-prefect" in command and "run.name=r4" in command and "trainer.total_steps=1" in command
    assert "checkpoint.every_steps=1" not in command and "PREFECT_API_URL" not in env


def test_variants_take_overrides_and_environment() -> None:
    variant = parse_variant("hf=model.impl=transformers,env:RAY_X=1", prefect=False)
    assert (variant.name, variant.overrides, variant.env) == ("hf (no prefect)", ["model.impl=transformers"], {"RAY_X": "1"})
