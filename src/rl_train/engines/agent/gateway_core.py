"""The gateway's work, without HTTP: open a session, answer one chat request, end the session.

``chat`` turns what a black-box agent sent into the session's ids (the first request's
messages must begin with the session's task: the prompt is the task's own ids, then whatever
that request adds, within the session's prompt and total token caps; later tool and user
messages are observations, mask 0), generates the model's next turn from those ids (mask 1, with
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
    text_before_call,
    tool_observation,
    user_observation,
)
from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.loop import AgentState, AgentTrajectory
from rl_train.engines.agent.safe_json import INT64_MAX
from rl_train.engines.agent.sessions import (
    Session,
    SessionError,
    SessionStore,
    normalize_message,
    tool_call_record,
)
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams

Generate = Callable[[GenerationRequest, SamplingParams], GenerationResult]
_DEFAULTS = AgentConfig()
"""``rollout.agent``'s defaults: a session opened without limits gets the configured ones."""


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
        self.model_name = model_name

    # -- sessions (the harness side, in process) ---------------------------------------------
    def open_session(
        self,
        session_id: str,
        max_response_tokens: int,
        max_turns: int,
        sampling: dict[str, Any] | None = None,
        *,
        task_ids: list[int],
        max_prompt_tokens: int = _DEFAULTS.gateway_max_prompt_tokens,
        max_total_tokens: int | None = _DEFAULTS.gateway_max_total_tokens,
    ) -> Session:
        """A session for the task ``task_ids`` (its prompt ids, as the rollout encoded them). The
        agent is given their text (decoded without special tokens, as here): its first request
        must begin with that text, and the trajectory's prompt begins with these very ids."""
        task_text = self.tokenizer.decode(task_ids, skip_special_tokens=True)
        return self.store.open(
            session_id, max_response_tokens, max_turns, sampling, task_ids=task_ids, task_text=task_text,
            max_prompt_tokens=max_prompt_tokens, max_total_tokens=max_total_tokens,
        )  # fmt: skip

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
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= INT64_MAX):
            raise SessionError(400, f"seed: got {seed!r}; allowed: an integer in [0, 2**63 - 1]", "invalid_value", "seed")
        if not session.lock.acquire(blocking=False):
            raise SessionError(409, "this session already has a request in flight: one at a time", "session_busy")
        try:
            return self._chat_locked(session, normalized, temperature, top_p, limit, seed)
        finally:
            session.lock.release()

    def _chat_locked(
        self, session: Session, normalized: list[dict[str, Any]], temperature: float, top_p: float, limit: int | None, seed: int | None
    ) -> ChatTurn:
        if session.ended:
            raise SessionError(410, "this session has ended", "session_ended")
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
        most = session.response_budget()
        room = most - len(trajectory.response_ids)
        if trajectory.turns >= session.max_turns or room <= 0:
            trajectory.stop_reason = "max_turns" if room > 0 else "length"
            session.transcript += added
            return ChatTurn({"role": "assistant", "content": ""}, "length", len(trajectory.prompt_ids), 0, [])
        budget = most if limit is None else min(most, len(trajectory.response_ids) + limit)
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
            prompt = self._prompt(session, added)
            session.trajectory = AgentTrajectory(session.session_id, prompt, states=[AgentState.PENDING])
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
            trajectory.add_observed(observation_ids(self.tokenizer, text), self.version(), session.response_budget())
        return trajectory

    def _prompt(self, session: Session, added: list[dict[str, Any]]) -> list[int]:
        """The trajectory's prompt: the task's own ids, then the ids of what the first request
        adds after the task's text (tokenized on its own, as an observation is). The agent
        chooses neither the task nor what comes before it, and the prompt is capped before it
        can reach an engine batch, where it would be padded beside every other session's."""
        if any(m["role"] not in ("system", "user") for m in added):
            raise SessionError(400, "the first request holds system and user messages only", "invalid_value", "messages")
        text = "\n".join(m["content"] for m in added)
        if not text.startswith(session.task_text):
            same = next((i for i, (a, b) in enumerate(zip(text, session.task_text, strict=False)) if a != b), len(text))
            raise SessionError(
                400,
                f"messages: the first request must begin with this session's task (the {len(session.task_text)} characters "
                f"the agent was given), its system and user messages joined by newlines; they differ at character {same}",
                "prompt_mismatch", "messages",
            )  # fmt: skip
        tail = text[len(session.task_text) :]
        ids = [*session.task_ids, *(self.tokenizer.encode(tail, add_special_tokens=False) if tail else [])]
        if len(ids) > session.max_prompt_tokens:
            raise SessionError(
                400,
                f"messages: the prompt is {len(ids)} tokens ({len(session.task_ids)} of them the task's); this session "
                f"allows at most {session.max_prompt_tokens} (rollout.agent.gateway_max_prompt_tokens)",
                "context_length_exceeded", "messages",
            )  # fmt: skip
        if len(ids) >= session.max_total_tokens:
            raise SessionError(
                400,
                f"messages: the prompt is {len(ids)} tokens, which leaves no room for a response within this session's "
                f"{session.max_total_tokens} (rollout.agent.gateway_max_total_tokens)",
                "context_length_exceeded", "messages",
            )  # fmt: skip
        return ids

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
