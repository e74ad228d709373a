"""The built-in code task (``tiny_function``) and what the code_tests reward does for it: the
prompt's code before the response (``prefix_field``) and the verdict cache (``cache_size``),
in the real sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rl_train.config import load_config
from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.code_tests import CodeTestsReward
from rl_train.engines.reward.config import CodeTestsConfig, RewardConfig
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.sandbox import SandboxConfig, SandboxResult, run_python
from rl_train.storage.builtin_data import BUILTIN_TASKS, tiny_function, write_builtin_task

REPO = Path(__file__).resolve().parents[2]


def reward(run: Any = run_python, **code_tests: Any) -> CodeTestsReward:
    config = CodeTestsConfig(**{"prefix_field": "prompt", "timeout_s": 6.0, "test_timeout_s": 1.0, **code_tests})
    return CodeTestsReward(config, SandboxConfig(memory_mb=512).tool_limits(config.timeout_s), run=run)


def answer(row: dict[str, Any], response: str) -> Trajectory:
    return Trajectory.of_answer(row, response)


class Counted:
    """``run_python``, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, *args: Any, **kwargs: Any) -> SandboxResult:
        self.runs += 1
        return run_python(*args, **kwargs)


def test_the_task_is_registered_and_written_with_its_tests(tmp_path: Path) -> None:
    assert "tiny_function" in BUILTIN_TASKS
    train_path, val_path = write_builtin_task("tiny_function", tmp_path)
    val = pq.read_table(val_path).to_pylist()
    assert len(val) == 24 and len({row["prompt"] for row in val}) == 24  # every function told apart
    assert len(pq.read_table(train_path).to_pylist()) == 2000
    row = next(r for r in val if r["ground_truth"] == "x+4")
    assert row["prompt"] == "#f(1)==5,f(2)==6\ndef f(x):return "
    assert row["tests"] == ["assert f(1)==5", "assert f(2)==6", "assert f(7)==11", "assert f(-4)==0"]
    assert RewardRouter(RewardConfig()).route(row["data_source"]) == "code_tests"


def test_the_right_body_passes_every_test_and_wrong_ones_fail_in_the_sandbox() -> None:
    _, val = tiny_function()
    judged = reward().score_batch([answer(row, str(row["ground_truth"])) for row in val])
    assert all(result == RewardResult(1.0, {"tests_passed": 4.0, "tests_total": 4.0}) for result in judged)
    rows = {row["ground_truth"]: row for row in val}
    wrong = [
        ("x+4", "x+5", 0.0),  # another function of the family
        ("x+4", "6", 0.25),  # the value at 2 only: a constant passes one test
        ("x+2", "x*2", 0.25),  # x*2 agrees with x+2 at 2, nowhere else it is tested
        ("x+4", "x+", 0.0),  # does not compile
    ]
    for function, response, score in wrong:
        assert reward()(answer(rows[function], response)).score == score, (function, response)
    assert reward()(answer(rows["x+4"], "4+x")).score == 1.0  # any code that passes, not the reference's text
    assert reward(scoring="all")(answer(rows["x+4"], "6")).score == 0.0


def test_without_the_prefix_the_response_runs_alone_and_a_row_without_it_is_refused() -> None:
    _, val = tiny_function()
    alone = reward(prefix_field=None)(answer(val[0], str(val[0]["ground_truth"])))  # no def f: a NameError each test
    assert alone == RewardResult(0.0, {"tests_passed": 0.0, "tests_total": 4.0})
    row = {**val[0], "head": "def f(x):return "}
    assert reward(prefix_field="head")(answer(row, "x+2")).score == 1.0  # a column of the row
    with pytest.raises(ValueError, match=r"has start=None.*column 'start' \(reward.code_tests.prefix_field\)"):
        reward(prefix_field="start").score_batch([answer(val[0], "x+2")])


def test_the_cache_gives_the_same_verdicts_with_fewer_sandbox_runs() -> None:
    _, val = tiny_function()
    rows = val[:2]
    batch = [answer(row, body) for row in rows for body in ("x+2", "x+3", "x+2", "x+2", "x*9", "x+3")]
    uncached, cached = Counted(), Counted()
    plain = reward(run=uncached).score_batch(batch)
    kept = reward(run=cached, cache_size=64)
    assert kept.score_batch(batch) == plain
    assert (uncached.runs, cached.runs) == (len(batch), 6)  # 3 distinct bodies x 2 rows
    assert kept.score_batch(batch[:3]) == plain[:3] and cached.runs == 6  # a later batch: all kept
    assert kept(batch[4]) == plain[4] and cached.runs == 6


def test_the_cache_keeps_its_size_and_never_an_infra_result() -> None:
    _, val = tiny_function()
    counted = Counted()
    small = reward(run=counted, cache_size=2)
    small.score_batch([answer(val[0], body) for body in ("x+1", "x+2", "x+3")])
    assert len(small.cache) == 2 and counted.runs == 3
    small(answer(val[0], "x+1"))  # the oldest was dropped: it runs again
    assert counted.runs == 4

    def broken(*args: Any, **kwargs: Any) -> SandboxResult:
        raise OSError("no sandbox")

    failing = reward(run=broken, cache_size=8)
    assert failing(answer(val[0], "x+2")).is_infra
    assert not failing.cache


def test_the_code_config_loads() -> None:
    config = load_config(REPO / "configs" / "code-tiny.yaml")
    assert config.data.builtin_task == "tiny_function" and config.model.pretrain_task == "tiny_function"
    assert config.reward.code_tests.prefix_field == "prompt" and config.reward.code_tests.cache_size > 0
    assert RewardRouter(config.reward, config.sandbox).route("code_tests/tiny_function") == "code_tests"
