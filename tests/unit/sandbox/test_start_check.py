"""A run that would execute untrusted code is refused at start where no sandbox can start,
naming ``sandbox.allow_unsandboxed``, unless that is true (then it warns); and the tool loop
keeps every tool call's deadline from outside the tool."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_train.cli import check_inputs
from rl_train.config import load_config
from rl_train.engines.agent.loop import TOOL_GRACE_S, AgentLimits, ToolAgentLoop
from rl_train.engines.agent.tools import ToolResult
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.sandbox import SandboxUnavailable, sandbox_problem


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    sandbox_problem.cache_clear()
    yield
    sandbox_problem.cache_clear()


def _overrides(tmp_path: Path, *more: str) -> list[str]:
    return [f"run.output_dir={tmp_path / 'runs'}", f"data.data_dir={tmp_path / 'data'}", *more]


def test_the_tool_agent_without_a_sandbox_is_refused_at_start(tmp_path: Path, no_bwrap: None) -> None:
    config = load_config(None, _overrides(tmp_path, "rollout.agent.default=tool_agent"))
    with pytest.raises(SandboxUnavailable, match=r"python tool.*sandbox\.allow_unsandboxed: true"):
        check_inputs(config)


def test_an_agent_command_without_a_sandbox_is_refused_at_start(tmp_path: Path, no_bwrap: None) -> None:
    config = load_config(None, _overrides(tmp_path, "rollout.agent.default=gateway_agent", "rollout.agent.gateway_command=[my-agent]"))
    with pytest.raises(SandboxUnavailable, match=r"rollout\.agent\.gateway_command.*apt-get install bubblewrap"):
        check_inputs(config)


def test_allowed_it_starts_with_a_warning(
    tmp_path: Path, no_bwrap: None, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(None, _overrides(tmp_path, "rollout.agent.default=tool_agent", "sandbox.allow_unsandboxed=true"))
    with caplog.at_level(logging.WARNING):
        check_inputs(config)
    assert any("WITHOUT a sandbox" in r.getMessage() for r in caplog.records)


def test_a_run_without_untrusted_code_needs_no_sandbox(tmp_path: Path, no_bwrap: None) -> None:
    check_inputs(load_config(None, _overrides(tmp_path)))  # single_turn, no agent command


class OneCallEngine:
    """Calls the python tool once, then answers."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.version, self.turn = tokenizer, 0, 0

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        text = '<tool_call>{"name":"python","arguments":{"code":"print(1)"}}</tool_call>' if self.turn == 0 else "ok"
        self.turn += 1
        request = requests[0]
        new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return [GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new],
                                 [-0.5] * len(new), [0] * len(new), "eos")]  # fmt: skip


def test_a_tool_that_overruns_becomes_a_time_out_observation(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool stuck past its limit (it ignores it) is answered from the loop at limit + grace."""
    release = threading.Event()

    def stuck(name: str, arguments: object, timeout_s: float, sandbox: object = None) -> ToolResult:
        release.wait(60)
        return ToolResult("too late")

    monkeypatch.setattr("rl_train.engines.agent.loop.run_tool", stuck)
    tokenizer = load_tokenizer(tiny_model_dir)
    loop = ToolAgentLoop(OneCallEngine(tokenizer), AgentLimits(tool_timeout_s=0.5, max_response_tokens=400))  # type: ignore[arg-type]
    started = time.monotonic()
    try:
        trajectory = loop.run("p/0", [tokenizer.bos_token_id], SamplingParams())
    finally:
        release.set()
    assert time.monotonic() - started < 0.5 + TOOL_GRACE_S + 10
    assert trajectory.tool_calls[0].error and trajectory.stop_reason == "eos"
    observed = tokenizer.decode(trajectory.response_ids, skip_special_tokens=True)
    assert "no answer within 0.5 s" in observed and "too late" not in observed


def test_the_runs_sandbox_section_reaches_the_python_tool(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.sandbox, dumped as the pools hand it to a rollout worker, is what the tool runs under."""
    from rl_train.engines.agent.config import AgentConfig
    from rl_train.engines.agent.loops import tool_agent

    seen: list[object] = []

    def recording(name: str, arguments: object, timeout_s: float, sandbox: object = None) -> ToolResult:
        seen.append(sandbox)
        return ToolResult("1")

    monkeypatch.setattr("rl_train.engines.agent.loop.run_tool", recording)
    config = load_config(None, ["sandbox.memory_mb=300", "sandbox.allow_unsandboxed=true"])
    agent = AgentConfig.model_validate(config.rollout.agent.model_dump()).with_sandbox(config.sandbox.model_dump())
    tokenizer = load_tokenizer(tiny_model_dir)
    tool_agent(OneCallEngine(tokenizer), [("p/0", [tokenizer.bos_token_id], [])], SamplingParams(), agent)  # type: ignore[arg-type]
    assert seen == [config.sandbox]
