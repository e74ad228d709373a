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
  its name as the stop reason. The tool time limit is also kept from here, outside the tool:
  a call not answered ``TOOL_GRACE_S`` past it is answered with the time-out error, and its
  thread is left to end (a sandboxed tool's sandbox is killed by then anyway).

A batch of trajectories is stepped together, but no trajectory waits for another's tool: each
round generates, as one engine batch, every trajectory whose tool has answered by then, while
the other calls keep running. ``tool_latency_median_s`` adds a heavy-tailed (lognormal) delay
to every call, drawn from the trajectory's id and turn alone, so that every trainer mode meets
the same tail on the same prompts: the latency of a real sandbox, for the async benchmarks. A
delay past the tool time limit answers with the time-out error.

Two interruptions. A ``stop`` event (set while the replica is held at the end of a run) ends
the trajectories still in flight as ``aborted`` at once, rather than after their tools answer.
An engine aborted while ``stop`` is clear (a pause: a weight push, the colocated mode's
training) interrupts a turn only: the trajectory keeps the tokens it got, under the weights
that sampled them, and its next round continues the same turn from them (the engine call
waits out the pause); a trajectory waiting on its tool is not touched.

The sequence is never re-tokenized: the ids the engine produced are kept as they are, and only
each new observation is encoded. ``first_drift`` shows where a re-tokenization of the whole
text would disagree with them (a decoder that drops a special token or a space does). A turn
that may be followed by another asks the engine to keep its keys and values (``keep_kv``): the
next turn then prefills only the tool's answer.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.agent.chat import parse_tool_call, tool_observation
from rl_train.engines.agent.tools import ToolResult, long_tail_seconds, run_tool
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams
from rl_train.engines.sandbox import GRACE_S, SandboxConfig


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
    tool_latency_median_s: float = 0.0
    """Median of the lognormal delay added to every tool call (0: none)."""
    tool_latency_sigma: float = 1.4
    """Shape of that delay: p99/p50 = exp(2.326 sigma)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """How the python tool runs its code."""

    def tool_delay(self, request_id: str, turn: int) -> float:
        """The delay of the call made at ``turn`` of trajectory ``request_id`` (0 when off)."""
        if self.tool_latency_median_s <= 0:
            return 0.0
        return long_tail_seconds(f"{request_id}#{turn}", self.tool_latency_median_s, self.tool_latency_sigma, float("inf"))

Call = tuple[str, dict[str, Any]] | str
"""A parsed tool call (name, arguments), or what is wrong with a malformed one."""

_POLL_SECONDS = 0.02
"""How often a loop waiting on tools looks at its stop event."""
TOOL_GRACE_S = 2 * GRACE_S
"""Past its time limit by this much an unanswered tool call is answered with the time-out error:
later than a sandbox's own kill (``GRACE_S``), so that a program's partial output usually
comes back first."""


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
    turn_start: int | None = None
    """Where the turn an engine abort interrupted began in ``response_ids`` (None between turns)."""

    def add_generated(self, ids: list[int], log_probs: list[float], versions: list[int], ended: bool = True) -> None:
        """A model turn's ids (mask 1), with their log-probs and weight versions; ``ended`` false:
        the turn was interrupted and goes on in the next round (not counted yet)."""
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.log_probs += log_probs
        self.token_versions += versions
        self.turns += int(ended)

    def add_observed(self, ids: list[int], version: int, budget: int) -> None:
        """What the world said back (mask 0, log-prob 0), cut to a response of ``budget`` tokens."""
        ids = ids[: max(budget - len(self.response_ids), 0)]
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.token_versions += [version] * len(ids)


def observation_text(result: ToolResult) -> str:
    return tool_observation(result.text)


@dataclass
class _ToolWait:
    """A trajectory in PROCESSING_TOOLS: its call, the call's future and when its answer may be read."""

    trajectory: AgentTrajectory
    call: Call
    answer: Future[ToolResult]
    ready_at: float
    """``time.monotonic()`` from which the answer may be read (the simulated latency, if any)."""
    delay: float
    deadline: float = float("inf")
    """``time.monotonic()`` at which a call still running is answered with the time-out error."""


class ToolAgentLoop:
    """Runs trajectories through the states above; ``run_batch`` steps many at once: each round
    of generation is one engine batch of the trajectories ready to generate, and tool calls run
    side by side on ``tool_threads`` threads."""

    def __init__(self, engine: RolloutEngine, limits: AgentLimits | None = None, tool_threads: int = 16) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.limits = limits or AgentLimits()
        self.tool_threads = tool_threads

    def run(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> AgentTrajectory:
        return self.run_batch([(request_id, prompt_ids)], params)[0]

    def run_batch(
        self,
        starts: list[tuple[str, list[int]]],
        params: SamplingParams,
        stop: threading.Event | None = None,
        on_done: Callable[[AgentTrajectory], None] | None = None,
        admit: Callable[[], list[tuple[str, list[int]]]] | None = None,
    ) -> list[AgentTrajectory]:
        """(request id, prompt ids) of each trajectory -> the trajectories, in that order.

        ``stop``: once set, every trajectory still in flight ends ``aborted`` (the engine's abort
        ends the ones generating; this ends the ones waiting on a tool). ``on_done`` is called,
        on this thread, with each trajectory as soon as it has ended (any reason), while the
        others go on: a caller can hand finished work on without waiting for the batch's tail.
        ``admit`` is asked, before each round and while waiting on tools, for more (request id,
        prompt ids): they join the batch, after the given ones in the result."""
        trajectories = [AgentTrajectory(rid, list(ids), states=[AgentState.PENDING]) for rid, ids in starts]
        reported: set[str] = set()

        def admitted() -> list[AgentTrajectory]:
            new = [AgentTrajectory(rid, list(ids), states=[AgentState.PENDING]) for rid, ids in (admit() if admit else [])]
            trajectories.extend(new)
            return new

        def report() -> None:
            for trajectory in trajectories:
                if on_done is not None and trajectory.stop_reason and trajectory.request_id not in reported:
                    reported.add(trajectory.request_id)
                    on_done(trajectory)

        turn_params = SamplingParams(
            params.temperature, params.top_p, self.limits.max_response_tokens, params.seed, params.ignore_eos,
            params.return_routes,
        )  # fmt: skip
        ready, waiting = list(trajectories), list[_ToolWait]()
        pool = ThreadPoolExecutor(self.tool_threads, thread_name_prefix="agent-tool")
        try:
            while ready or waiting:
                if stop is not None and stop.is_set():
                    break
                ready += admitted()
                generating = [t for t in ready if not self._out_of_room(t)]
                interrupted: list[AgentTrajectory] = []
                if generating and self._generate_round(generating, turn_params, pool, waiting, stop, interrupted):
                    break  # the engine was aborted: the replica is being held
                report()
                # an interrupted turn goes on at once (its engine call waits out the pause)
                ready = interrupted + self._answered(waiting, stop, block=not interrupted, more=admitted)
            for trajectory in [*ready, *(w.trajectory for w in waiting)]:
                if not trajectory.stop_reason:
                    self._end(trajectory, "aborted")
            report()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return trajectories

    def _generate_round(
        self,
        generating: list[AgentTrajectory],
        params: SamplingParams,
        pool: ThreadPoolExecutor,
        waiting: list[_ToolWait],
        stop: threading.Event | None = None,
        interrupted: list[AgentTrajectory] | None = None,
    ) -> bool:
        """One engine batch; each turn that calls a tool starts the call. True when it was aborted
        under ``stop`` (or with no ``stop`` to tell a pause by); a turn aborted by a pause is kept
        and goes into ``interrupted``, to go on."""
        for trajectory in generating:
            if trajectory.turn_start is None:  # an interrupted turn is still the same GENERATING
                trajectory.states.append(AgentState.GENERATING)
        last_turn = self.limits.max_turns - 1
        requests = [
            GenerationRequest(t.request_id, t.prompt_ids, list(t.response_ids), keep_kv=t.turns < last_turn)
            for t in generating
        ]
        aborted = False
        for trajectory, result in zip(generating, self.engine.generate(requests, params), strict=True):
            start = len(trajectory.response_ids) if trajectory.turn_start is None else trajectory.turn_start
            paused = result.stop_reason == "aborted" and stop is not None and not stop.is_set()
            parked = interrupted if paused else None  # where a paused turn waits; None: it ended
            self._append_turn(trajectory, result, ended=parked is None)
            if parked is not None:
                trajectory.turn_start = start
                parked.append(trajectory)
                continue
            trajectory.turn_start = None
            if result.stop_reason == "aborted":
                self._end(trajectory, "aborted")
                aborted = True
                continue
            new_ids = trajectory.response_ids[start:]
            text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
            assert isinstance(text, str)  # transformers types decode str | list[str]; one id list is one str
            call = parse_tool_call(text)
            if call is None:
                self._end(trajectory, result.stop_reason)
            else:
                trajectory.states.append(AgentState.PROCESSING_TOOLS)
                waiting.append(self._start_tool(trajectory, call, pool))
        return aborted

    def _start_tool(self, trajectory: AgentTrajectory, call: Call, pool: ThreadPoolExecutor) -> _ToolWait:
        """A malformed call is answered with what is wrong with it; a call slower than the time limit
        (by its simulated delay) with the time-out error, once the limit has passed."""
        timeout = self.limits.tool_timeout_s
        delay = self.limits.tool_delay(trajectory.request_id, trajectory.turns)
        answer: Future[ToolResult]
        if isinstance(call, str) or delay > timeout:
            answer = Future()
            text = f"error: {call}" if isinstance(call, str) else f"error: no answer within {timeout:g} s"
            answer.set_result(ToolResult(text, True))
            delay = min(delay, timeout)
        else:
            answer = pool.submit(run_tool, call[0], call[1], timeout, self.limits.sandbox)
        now = time.monotonic()
        return _ToolWait(trajectory, call, answer, now + delay, delay, now + timeout + TOOL_GRACE_S)

    def _overran(self, waiting: list[_ToolWait], now: float) -> None:
        """Answers each call still running past its deadline with the time-out error (its thread
        goes on alone; the sandbox it runs is killed at its own deadline)."""
        limit = self.limits.tool_timeout_s
        for wait_ in waiting:
            if not wait_.answer.done() and now >= wait_.deadline:
                wait_.answer = Future()
                wait_.answer.set_result(ToolResult(f"error: no answer within {limit:g} s", True, limit + TOOL_GRACE_S))

    def _answered(
        self,
        waiting: list[_ToolWait],
        stop: threading.Event | None,
        block: bool = True,
        more: Callable[[], list[AgentTrajectory]] | None = None,
    ) -> list[AgentTrajectory]:
        """Waits until at least one call has answered, or ``more`` (asked at each look) gives new
        trajectories, or ``stop`` is set (not at all unless ``block``); takes every answered call
        out of ``waiting``, observes its answer and returns those trajectories (and the new ones),
        ready to generate."""
        while waiting:
            new = more() if more is not None else []
            if new:
                return new + self._answered(waiting, stop, block=False)
            now = time.monotonic()
            self._overran(waiting, now)
            done = [w for w in waiting if w.answer.done() and w.ready_at <= now]
            if done:
                for wait_ in done:
                    waiting.remove(wait_)
                    result = wait_.answer.result()
                    result.seconds += wait_.delay
                    self._observe(wait_.trajectory, wait_.call, result)
                return [w.trajectory for w in done]
            if not block or (stop is not None and stop.is_set()):
                return []
            running = [w.answer for w in waiting if not w.answer.done()]
            next_ready = min((w.ready_at for w in waiting if w.answer.done()), default=None)
            next_deadline = min((w.deadline for w in waiting if not w.answer.done()), default=float("inf"))
            if next_deadline < float("inf") and (next_ready is None or next_deadline < next_ready):
                next_ready = next_deadline
            timeout = None if next_ready is None else max(next_ready - now, 0.0)
            if stop is not None or more is not None:
                timeout = _POLL_SECONDS if timeout is None else min(timeout, _POLL_SECONDS)
            if running:
                wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            else:
                time.sleep(timeout or 0.0)
        return []

    def _out_of_room(self, trajectory: AgentTrajectory) -> bool:
        """Ends a trajectory that may not generate again (its turns or tokens are spent)."""
        room = self.limits.max_response_tokens - len(trajectory.response_ids)
        if trajectory.turns < self.limits.max_turns and room > 0:
            return False
        self._end(trajectory, "max_turns" if room > 0 else "length")
        return True

    def _append_turn(self, trajectory: AgentTrajectory, result: Any, ended: bool = True) -> list[int]:
        new_ids = list(result.response_ids[len(trajectory.response_ids) :])
        trajectory.add_generated(new_ids, list(result.log_probs), list(result.token_versions), ended)
        return new_ids

    def _observe(self, trajectory: AgentTrajectory, call: Call, result: ToolResult) -> None:
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
