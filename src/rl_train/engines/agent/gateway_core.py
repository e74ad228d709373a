"""The gateway's work, without HTTP: open a session, answer one chat request, end the session.

``chat`` turns what a black-box agent sent into the session's ids (its new tool and user
messages as observations, mask 0), generates the model's next turn from those ids (mask 1, with
its log-probs and versions), and shows the turn to the agent as an OpenAI assistant message:
text, or a ``tool_calls`` entry when the turn wrote a tool call (``chat.py``'s layout). The
engine is reached through ``generate`` (one request in, one result out), which a replica backs
with a micro-batcher so that concurrent sessions share engine batches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl_train.engines.agent.chat import (
    observation_ids,
    parse_tool_call,
    prompt_ids,
    text_before_call,
    tool_observation,
    user_observation,
)
from rl_train.engines.agent.loop import AgentState, AgentTrajectory
from rl_train.engines.agent.sessions import (
    Session,
    SessionError,
    SessionStore,
    normalize_message,
    tool_call_record,
)
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams

Generate = Callable[[GenerationRequest, SamplingParams], GenerationResult]


@dataclass
class ChatTurn:
    """One answered request: the assistant message as the client sees it, and why it stopped."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SessionError(400, f"{key}: got {value!r}; allowed: a number in [{low:g}, {high:g}]")
    return float(value)


@dataclass
class _Mark:
    """How long each of a session's lists was before a request, to undo it."""

    had_trajectory: bool
    lengths: tuple[int, ...]
    turns: int
    stop_reason: str
    transcript: int
    last_answer_at: float

    @classmethod
    def of(cls, session: Session) -> _Mark:
        t = session.trajectory
        lengths = (
            (len(t.response_ids), len(t.response_mask), len(t.log_probs), len(t.token_versions), len(t.tool_calls), len(t.states))
            if t is not None
            else ()
        )
        return cls(t is not None, lengths, t.turns if t else 0, t.stop_reason if t else "", len(session.transcript), session.last_answer_at)

    def restore(self, session: Session) -> None:
        del session.transcript[self.transcript :]
        session.last_answer_at = self.last_answer_at
        t = session.trajectory
        if not self.had_trajectory or t is None:
            session.trajectory = None
            return
        columns: tuple[list[Any], ...] = (t.response_ids, t.response_mask, t.log_probs, t.token_versions, t.tool_calls, t.states)
        for values, length in zip(columns, self.lengths, strict=True):
            del values[length:]
        t.turns, t.stop_reason = self.turns, self.stop_reason


class GatewayCore:
    def __init__(
        self,
        generate: Generate,
        tokenizer: Any,
        version: Callable[[], int],
        store: SessionStore | None = None,
        model_name: str = "rl-train-policy",
    ) -> None:
        self.generate, self.tokenizer, self.version = generate, tokenizer, version
        self.store = store if store is not None else SessionStore()
        self.open_session = self.store.open
        """Open a session (the harness side, in process): ``SessionStore.open``."""
        self.model_name = model_name

    # -- sessions (the harness side, in process) ---------------------------------------------
    def end_session(self, session_id: str) -> AgentTrajectory:
        """Close the session; its trajectory (an empty one if the agent never asked anything)."""
        session = self.store.close(session_id)
        with session.lock:
            trajectory = session.trajectory or AgentTrajectory(session_id, [], states=[AgentState.PENDING])
            if not trajectory.stop_reason:
                trajectory.stop_reason = "no_request" if session.trajectory is None else "eos"
            if trajectory.states[-1] != AgentState.TERMINATED:
                trajectory.states.append(AgentState.TERMINATED)
            return trajectory

    # -- one chat request ---------------------------------------------------------------------
    def chat(self, session: Session, body: dict[str, Any]) -> ChatTurn:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise SessionError(400, "messages: a non-empty list of messages is required")
        if body.get("n", 1) != 1:
            raise SessionError(400, f"n: got {body.get('n')!r}; allowed: 1 (one trajectory per session)")
        normalized = [normalize_message(m, i) for i, m in enumerate(messages)]
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 1e-6, 1.0)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise SessionError(400, f"max_tokens: got {limit!r}; allowed: a positive integer")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise SessionError(400, f"seed: got {seed!r}; allowed: an integer")
        with session.lock:
            if session.ended:
                raise SessionError(410, "this session has ended")
            added = session.new_messages(normalized)
            saved = _Mark.of(session)
            forced = session.sampling
            temperature = float(forced.get("temperature", temperature))
            top_p = float(forced.get("top_p", top_p))
            seed = forced["seed"] if forced.get("seed") is not None else seed
            try:
                return self._answer(session, added, temperature, top_p, limit, seed)
            except BaseException:
                saved.restore(session)  # a failed request leaves the session as it was
                raise

    def _answer(
        self, session: Session, added: list[dict[str, Any]], temperature: float, top_p: float, limit: int | None, seed: int | None
    ) -> ChatTurn:
        trajectory = self._append(session, added)
        room = session.max_response_tokens - len(trajectory.response_ids)
        if trajectory.turns >= session.max_turns or room <= 0:
            trajectory.stop_reason = "max_turns" if room > 0 else "length"
            session.transcript += added
            return ChatTurn({"role": "assistant", "content": ""}, "length", len(trajectory.prompt_ids), 0, [])
        budget = session.max_response_tokens if limit is None else min(session.max_response_tokens, len(trajectory.response_ids) + limit)
        params = SamplingParams(temperature, top_p, budget, seed)
        trajectory.states.append(AgentState.GENERATING)
        keep = trajectory.turns + 1 < session.max_turns  # the session may come back for another turn
        request = GenerationRequest(session.session_id, trajectory.prompt_ids, list(trajectory.response_ids), keep_kv=keep)
        result = self.generate(request, params)
        new_ids = list(result.response_ids[len(trajectory.response_ids) :])
        trajectory.add_generated(new_ids, list(result.log_probs), list(result.token_versions))
        trajectory.stop_reason = result.stop_reason
        message, finish = self._assistant_message(session, new_ids, result.stop_reason, trajectory.turns)
        session.transcript += [*added, normalize_message(message, len(session.transcript) + len(added))]
        session.last_answer_at = time.monotonic()
        return ChatTurn(message, finish, len(trajectory.prompt_ids), len(new_ids), new_ids)

    def _append(self, session: Session, added: list[dict[str, Any]]) -> AgentTrajectory:
        """The session's trajectory with ``added`` in it: the first request's messages are the
        prompt; later tool and user messages are observations (mask 0)."""
        if session.trajectory is None:
            if any(m["role"] not in ("system", "user") for m in added):
                raise SessionError(400, "the first request holds system and user messages only")
            text = "\n".join(m["content"] for m in added)
            session.trajectory = AgentTrajectory(session.session_id, prompt_ids(self.tokenizer, text), states=[AgentState.PENDING])
            return session.trajectory
        trajectory = session.trajectory
        last_calls = {c["id"]: c["name"] for c in (session.transcript[-1].get("tool_calls") or [])} if session.transcript else {}
        for message in added:
            if message["role"] == "tool":
                text = tool_observation(message["content"])
                name = last_calls.get(message.get("tool_call_id"), "<unknown>")
                trajectory.tool_calls.append(tool_call_record(name, time.monotonic() - session.last_answer_at))
                trajectory.states.append(AgentState.PROCESSING_TOOLS)
            else:
                text = user_observation(message["content"])
            trajectory.add_observed(observation_ids(self.tokenizer, text), self.version(), session.max_response_tokens)
        return trajectory

    def _assistant_message(self, session: Session, new_ids: list[int], stop_reason: str, turn: int) -> tuple[dict[str, Any], str]:
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        call = parse_tool_call(text)
        if isinstance(call, tuple):
            tool_call = {
                "id": f"call_{session.session_id}_{turn}",
                "type": "function",
                "function": {"name": call[0], "arguments": json.dumps(call[1])},
            }
            return {"role": "assistant", "content": text_before_call(text) or None, "tool_calls": [tool_call]}, "tool_calls"
        return {"role": "assistant", "content": text}, "length" if stop_reason == "length" else "stop"
