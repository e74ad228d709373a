"""The multi-turn tool agent loop (R-5.4): the policy generates, calls tools, reads their answers.

States: PENDING -> GENERATING <-> PROCESSING_TOOLS -> TERMINATED.

- **GENERATING.** The engine continues the trajectory from its own token ids (the prompt, then
  everything so far as the response prefix) until it ends its turn (EOS) or the response
  budget runs out. Generated tokens get ``response_mask`` 1 and their log-probs.
- **Tool calls** (the layout is ``chat.py``'s, shared with the gateway) are JSON inside tags, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.agent.chat import parse_tool_call, tool_observation
from rl_train.engines.agent.tools import ToolResult, run_tool
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams


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
    routes: list[Any] | None = None
    """single_turn with routes asked for: the experts the engine used (R3)."""

    def add_generated(self, ids: list[int], log_probs: list[float], versions: list[int]) -> None:
        """A model turn's ids (mask 1), with their log-probs and weight versions."""
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.log_probs += log_probs
        self.token_versions += versions
        self.turns += 1

    def add_observed(self, ids: list[int], version: int, budget: int) -> None:
        """What the world said back (mask 0, log-prob 0), cut to a response of ``budget`` tokens."""
        ids = ids[: max(budget - len(self.response_ids), 0)]
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.token_versions += [version] * len(ids)


def observation_text(result: ToolResult) -> str:
    return tool_observation(result.text)


class ToolAgentLoop:
    """Runs trajectories through the states above; ``run_batch`` steps many at once, so that
    each round of generation is one engine batch and the round's tool calls run side by side."""

    def __init__(self, engine: RolloutEngine, limits: AgentLimits | None = None, tool_threads: int = 16) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.limits = limits or AgentLimits()
        self.tool_threads = tool_threads

    def run(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> AgentTrajectory:
        return self.run_batch([(request_id, prompt_ids)], params)[0]

    def run_batch(self, starts: list[tuple[str, list[int]]], params: SamplingParams) -> list[AgentTrajectory]:
        """(request id, prompt ids) of each trajectory -> the trajectories, in that order."""
        trajectories = [AgentTrajectory(rid, list(ids), states=[AgentState.PENDING]) for rid, ids in starts]
        active = list(trajectories)
        turn_params = SamplingParams(
            params.temperature, params.top_p, self.limits.max_response_tokens, params.seed, params.ignore_eos,
            params.return_routes,
        )  # fmt: skip
        while active:
            generating = [t for t in active if not self._out_of_room(t)]
            if not generating:
                break
            for trajectory in generating:
                trajectory.states.append(AgentState.GENERATING)
            requests = [GenerationRequest(t.request_id, t.prompt_ids, list(t.response_ids)) for t in generating]
            calls: list[tuple[AgentTrajectory, tuple[str, dict[str, Any]] | str]] = []
            for trajectory, result in zip(generating, self.engine.generate(requests, turn_params), strict=True):
                new_ids = self._append_turn(trajectory, result)
                if result.stop_reason == "aborted":
                    self._end(trajectory, "aborted")
                    continue
                call = parse_tool_call(self.tokenizer.decode(new_ids, skip_special_tokens=True))
                if call is None:
                    self._end(trajectory, result.stop_reason)
                else:
                    trajectory.states.append(AgentState.PROCESSING_TOOLS)
                    calls.append((trajectory, call))
            for (trajectory, call), outcome in zip(calls, self._run_tools([c for _, c in calls]), strict=True):
                self._observe(trajectory, call, outcome)
            active = [t for t in generating if not t.stop_reason]
        return trajectories

    def _out_of_room(self, trajectory: AgentTrajectory) -> bool:
        """Ends a trajectory that may not generate again (its turns or tokens are spent)."""
        room = self.limits.max_response_tokens - len(trajectory.response_ids)
        if trajectory.turns < self.limits.max_turns and room > 0:
            return False
        self._end(trajectory, "max_turns" if room > 0 else "length")
        return True

    def _append_turn(self, trajectory: AgentTrajectory, result: Any) -> list[int]:
        new_ids = list(result.response_ids[len(trajectory.response_ids) :])
        trajectory.add_generated(new_ids, list(result.log_probs), list(result.token_versions))
        return new_ids

    def _run_tools(self, calls: list[tuple[str, dict[str, Any]] | str]) -> list[ToolResult]:
        """Each well-formed call run with the tool time limit, side by side; a malformed one answered
        with what is wrong with it."""

        def one(call: tuple[str, dict[str, Any]] | str) -> ToolResult:
            if isinstance(call, str):
                return ToolResult(f"error: {call}", True)
            return run_tool(call[0], call[1], self.limits.tool_timeout_s)

        if len(calls) <= 1:
            return [one(call) for call in calls]
        with ThreadPoolExecutor(min(self.tool_threads, len(calls)), thread_name_prefix="agent-tool") as pool:
            return list(pool.map(one, calls))

    def _observe(self, trajectory: AgentTrajectory, call: tuple[str, dict[str, Any]] | str, result: ToolResult) -> None:
        """The tool's answer appended as observation ids (mask 0), cut to the response budget."""
        name = "<malformed>" if isinstance(call, str) else call[0]
        trajectory.tool_calls.append(ToolCallRecord(name, result.error, result.seconds))
        observed = self.tokenizer.encode(observation_text(result), add_special_tokens=False)
        trajectory.add_observed(observed, self.engine.version, self.limits.max_response_tokens)

    @staticmethod
    def _end(trajectory: AgentTrajectory, reason: str) -> AgentTrajectory:
        trajectory.stop_reason = reason
        trajectory.states.append(AgentState.TERMINATED)
        return trajectory


def first_drift(tokenizer: Any, ids: list[int]) -> int | None:
    """The first position where re-tokenizing the text of ``ids`` (as a chat client sees it:
    special tokens dropped) would give other ids than ``ids``; None when they agree all the way."""
    again = tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False)
    for position, (kept, redone) in enumerate(zip(ids, again, strict=False)):
        if kept != redone:
            return position
    return None if len(ids) == len(again) else min(len(ids), len(again))
