"""The tool agent loop (R-5.4): state transitions, limits, error observations, masks that align
token for token with what the engine generated, and no re-tokenization drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_train.engines.agent.loop import AgentLimits, AgentState, ToolAgentLoop, first_drift, parse_tool_call
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams

P, G, T, E = AgentState.PENDING, AgentState.GENERATING, AgentState.PROCESSING_TOOLS, AgentState.TERMINATED


class ScriptedEngine:
    """A rollout engine that answers turn after turn from a script (each turn ends with EOS)."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.version = tokenizer, list(turns), 3
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        request = requests[0]
        self.requests.append(request)
        text = self.turns.pop(0) if self.turns else "done"
        room = params.max_new_tokens - len(request.response_prefix)
        new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id][:room]
        reason = "eos" if new and new[-1] == self.tokenizer.eos_token_id else "length"
        logps = [-0.5 - 0.01 * i for i in range(len(new))]
        return [
            GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new], logps,
                             [self.version] * len(new), reason)  # fmt: skip
        ]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


def _run(tokenizer, turns: list[str], **limits) -> tuple[ToolAgentLoop, object]:
    engine = ScriptedEngine(tokenizer, turns)
    loop = ToolAgentLoop(engine, AgentLimits(**limits))  # type: ignore[arg-type]
    return engine, loop.run("p/0", [tokenizer.bos_token_id, *tokenizer.encode("12+30=", add_special_tokens=False)], SamplingParams())


def test_a_tool_call_then_an_answer(tokenizer) -> None:
    engine, trajectory = _run(
        tokenizer, ['<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>', "42"], max_response_tokens=200
    )
    assert trajectory.states == [P, G, T, G, E] and trajectory.stop_reason == "eos" and trajectory.turns == 2
    assert [(c.name, c.error) for c in trajectory.tool_calls] == [("calculator", False)]
    observed = tokenizer.encode("<tool_response>42</tool_response>", add_special_tokens=False)
    call = [*tokenizer.encode('<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>', add_special_tokens=False), tokenizer.eos_token_id]
    answer = [*tokenizer.encode("42", add_special_tokens=False), tokenizer.eos_token_id]
    assert trajectory.response_ids == call + observed + answer  # the engine's ids, then the observation's
    assert trajectory.response_mask == [1] * len(call) + [0] * len(observed) + [1] * len(answer)
    assert len(trajectory.log_probs) == len(trajectory.token_versions) == len(trajectory.response_ids)
    assert all(lp == 0.0 for lp, m in zip(trajectory.log_probs, trajectory.response_mask, strict=True) if m == 0)
    assert engine.requests[1].response_prefix == call + observed  # the second turn continues from those ids


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "the tool call is not JSON"),
        ('<tool_call>{"name":"calculator","arguments":{"expression":"1+"}}', "without its closing"),
        ('<tool_call>{"name":"shell","arguments":{}}</tool_call>', "unknown tool 'shell'"),
        ('<tool_call>{"name":"calculator","arguments":{"x":1}}</tool_call>', "'expression' is a required property"),
        ('<tool_call>["calculator"]</tool_call>', 'a tool call is {"name"'),
    ],
)
def test_a_malformed_call_is_an_error_observation_and_the_loop_goes_on(tokenizer, turn: str, message: str) -> None:
    _, trajectory = _run(tokenizer, [turn, "7"], max_response_tokens=400)
    assert trajectory.states == [P, G, T, G, E] and trajectory.tool_calls[0].error
    text = tokenizer.decode(trajectory.response_ids, skip_special_tokens=True)
    assert "<tool_response>error:" in text and message.replace(" ", "") in text.replace(" ", "")  # the model reads why
    assert parse_tool_call(turn) is not None


def test_the_turn_limit_ends_a_loop_that_keeps_calling_tools(tokenizer) -> None:
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"1+1"}}</tool_call>'
    _, trajectory = _run(tokenizer, [call] * 10, max_turns=3, max_response_tokens=1000)
    assert trajectory.stop_reason == "max_turns" and trajectory.turns == 3
    assert trajectory.states == [P, G, T, G, T, G, T, E]


def test_the_response_budget_ends_a_long_trajectory(tokenizer) -> None:
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"1+1"}}</tool_call>'
    _, trajectory = _run(tokenizer, [call] * 10, max_turns=10, max_response_tokens=120)
    assert trajectory.stop_reason == "length" and len(trajectory.response_ids) <= 120


def test_a_slow_tool_hits_the_tool_time_limit(tokenizer) -> None:
    call = '<tool_call>{"name":"long_tail","arguments":{"query":"q","median_s":30,"sigma":0}}</tool_call>'
    _, trajectory = _run(tokenizer, [call, "ok"], tool_timeout_s=0.2, max_response_tokens=400)
    assert trajectory.tool_calls[0].error and trajectory.tool_calls[0].seconds < 5


def test_with_the_built_in_engine_the_masks_follow_what_was_generated(tiny_model_dir: Path) -> None:
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

    engine = TorchRolloutEngine(tiny_model_dir, seed=0)
    loop = ToolAgentLoop(engine, AgentLimits(max_turns=3, max_response_tokens=48))
    prompt = [engine.tokenizer.bos_token_id, *engine.tokenizer.encode("3+4=", add_special_tokens=False)]
    trajectory = loop.run("p/0", prompt, SamplingParams(1.0, 1.0, 8, seed=1))
    assert trajectory.states[0] == P and trajectory.states[-1] == E
    assert len(trajectory.response_mask) == len(trajectory.response_ids) == len(trajectory.log_probs)
    generated = [t for t, m in zip(trajectory.response_ids, trajectory.response_mask, strict=True) if m]
    assert generated and all(lp <= 0 for lp, m in zip(trajectory.log_probs, trajectory.response_mask, strict=True) if m)


def test_re_tokenizing_agrees_where_it_should_and_drift_is_caught(tokenizer) -> None:
    plain = tokenizer.encode("12+30=42<tool_response>42</tool_response>", add_special_tokens=False)
    assert first_drift(tokenizer, plain) is None
    with_eos = plain[:3] + [tokenizer.eos_token_id] + plain[3:]  # a turn's EOS in the middle: decode drops it
    assert first_drift(tokenizer, with_eos) == 3
