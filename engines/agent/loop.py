"""The multi-turn tool agent loop (R-5.4): the policy generates, calls tools, reads their answers.

States: PENDING -> GENERATING <-> PROCESSING_TOOLS -> TERMINATED.

- **GENERATING.** The engine continues the trajectory from its own token ids (the prompt, then
  everything so far as the response prefix) until it ends its turn (EOS) or the response
  budget runs out. Generated tokens get ``response_mask`` 1 and their log-probs.
- **Tool calls** are JSON inside tags, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (the first one of a turn is run). A turn without one is the final answer: TERMINATED.
- **PROCESSING_TOOLS.** The tool runs (``tools.run_tool``, with the tool time limit); its answer
  is templated as ``<tool_response>...</tool_response>`` and tokenized on its own, and those
  ids are appended with ``response_mask`` 0. A malformed call, an unknown tool or a tool that
  fails becomes an error observation the model reads; the loop never crashes on it.
- **Limits.** ``max_turns`` model turns, ``max_response_tokens`` tokens of response (generated
  and observed together), ``tool_timeout_s`` per call; hitting one ends the trajectory with
  its name as the stop reason.

The sequence is never re-tokenized: the ids the engine produced are kept as they are, and only
each new observation is encoded. ``first_drift`` shows where a re-tokenization of the whole text
would disagree with them (a decoder that drops a special token or a space does).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.agent.tools import ToolResult, run_tool
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN_CALL = "<tool_call>"


class AgentState(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


@dataclass
class AgentLimits:
    max_turns: int = 4
    max_response_tokens: int = 64
    tool_timeout_s: float = 5.0


@dataclass
class ToolCallRecord:
    name: str
    error: bool
    seconds: float


@dataclass
class AgentTrajectory:
    request_id: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    """1 on tokens the model generated, 0 on tool observations."""
    log_probs: list[float] = field(default_factory=list)
    """Per response token: its log-prob when generated, 0.0 on observation tokens."""
    token_versions: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stop_reason: str = ""
    states: list[AgentState] = field(default_factory=list)
    """Every state the loop passed through, in order."""


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | str | None:
    """The first tool call of a turn: (name, arguments); a message naming what is wrong with a
    malformed one; None when the turn calls no tool."""
    match = TOOL_CALL.search(text)
    if match is None:
        return "a <tool_call> without its closing </tool_call>" if OPEN_CALL in text else None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError as error:
        return f"the tool call is not JSON ({error.msg} at character {error.pos})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call is {"name": <tool>, "arguments": {...}}'
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return "the tool call's arguments are not an object"
    return call["name"], arguments


def observation_text(result: ToolResult) -> str:
    return f"<tool_response>{result.text}</tool_response>"


class ToolAgentLoop:
    def __init__(self, engine: RolloutEngine, limits: AgentLimits | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.limits = limits or AgentLimits()

    def run(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> AgentTrajectory:
        trajectory = AgentTrajectory(request_id, list(prompt_ids), states=[AgentState.PENDING])
        limits = self.limits
        while True:
            room = limits.max_response_tokens - len(trajectory.response_ids)
            if trajectory.turns >= limits.max_turns or room <= 0:
                return self._end(trajectory, "max_turns" if room > 0 else "length")
            trajectory.states.append(AgentState.GENERATING)
            turn = self._generate(trajectory, params, room)
            trajectory.turns += 1
            if turn.stop_reason == "aborted":
                return self._end(trajectory, "aborted")
            call = parse_tool_call(self.tokenizer.decode(turn.new_ids, skip_special_tokens=True))
            if call is None:
                return self._end(trajectory, turn.stop_reason)
            trajectory.states.append(AgentState.PROCESSING_TOOLS)
            if isinstance(call, str):
                result = ToolResult(f"error: {call}", True)
                trajectory.tool_calls.append(ToolCallRecord("<malformed>", True, 0.0))
            else:
                result = run_tool(call[0], call[1], limits.tool_timeout_s)
                trajectory.tool_calls.append(ToolCallRecord(call[0], result.error, result.seconds))
            observed = self.tokenizer.encode(observation_text(result), add_special_tokens=False)
            observed = observed[: limits.max_response_tokens - len(trajectory.response_ids)]
            trajectory.response_ids += observed
            trajectory.response_mask += [0] * len(observed)
            trajectory.log_probs += [0.0] * len(observed)
            trajectory.token_versions += [self.engine.version] * len(observed)

    def _generate(self, trajectory: AgentTrajectory, params: SamplingParams, room: int) -> _Turn:
        before = len(trajectory.response_ids)
        request = GenerationRequest(trajectory.request_id, trajectory.prompt_ids, list(trajectory.response_ids))
        turn_params = SamplingParams(
            params.temperature, params.top_p, before + room, params.seed, params.ignore_eos, params.return_routes
        )
        result = self.engine.generate([request], turn_params)[0]
        new_ids = result.response_ids[before:]
        trajectory.response_ids += new_ids
        trajectory.response_mask += [1] * len(new_ids)
        trajectory.log_probs += result.log_probs
        trajectory.token_versions += result.token_versions
        return _Turn(new_ids, result.stop_reason)

    @staticmethod
    def _end(trajectory: AgentTrajectory, reason: str) -> AgentTrajectory:
        trajectory.stop_reason = reason
        trajectory.states.append(AgentState.TERMINATED)
        return trajectory


@dataclass
class _Turn:
    new_ids: list[int]
    stop_reason: str


def first_drift(tokenizer: Any, ids: list[int]) -> int | None:
    """The first position where re-tokenizing the text of ``ids`` (as a chat client sees it:
    special tokens dropped) would give other ids than ``ids``; None when they agree all the way."""
    again = tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False)
    for position, (kept, redone) in enumerate(zip(ids, again, strict=False)):
        if kept != redone:
            return position
    return None if len(ids) == len(again) else min(len(ids), len(again))
