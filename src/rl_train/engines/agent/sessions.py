"""Gateway sessions (R-5.5): one black-box agent's conversation with the policy, token by token.

A session is opened by whoever runs the agent (the rollout replica); it gets a random bearer token, which is the agent's API key, and its id is the
trajectory's request id. Every chat request of that token must repeat the session's history
so far (what the agent was told, and the model's own answers exactly as they were returned)
and may add tool or user messages after it: those become observation ids (mask 0), and the
model's next turn is generated from the session's own ids, never from a re-tokenization of the
messages. Anything else (another history, an assistant message the model did not write) is
refused and changes nothing. When the session ends, its trajectory is the record the tool loop
writes for the same tokens (``chat.py``'s layout).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from rl_train.engines.agent.loop import AgentTrajectory, ToolCallRecord
from rl_train.engines.agent.safe_json import UnsafeJson, loads_bounded


class SessionError(Exception):
    """A request the gateway refuses: ``status`` is the HTTP status it maps to; ``code`` and
    ``param`` (the field at fault), when known, fill OpenAI's error object."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def normalize_message(message: Any, index: int) -> dict[str, Any]:
    """The parts of a chat message that define the conversation: role, text, tool calls (name
    and parsed arguments), tool_call_id. Raises ``SessionError`` (400) naming what is wrong."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise SessionError(400, f"{where}: a message is an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise SessionError(400, f"{where}.role: got {role!r}; allowed: system, user, assistant, tool")
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        if not all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content):
            raise SessionError(400, f"{where}.content: parts must be objects with a text")
        content = "".join(p.get("text", "") for p in content)
    if content is not None and not isinstance(content, str):
        raise SessionError(400, f"{where}.content: a string, a list of text parts or null, got {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": content or ""}
    if role == "assistant":
        calls = []
        listed = message.get("tool_calls") or []
        if not isinstance(listed, list):
            raise SessionError(400, f"{where}.tool_calls: a list, got {type(listed).__name__}")
        for j, call in enumerate(listed):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise SessionError(400, f"{where}.tool_calls[{j}]: needs function.name")
            text = function.get("arguments") or "{}"
            if not isinstance(text, str):
                raise SessionError(400, f"{where}.tool_calls[{j}].function.arguments: a JSON string, got {type(text).__name__}")
            try:
                arguments = loads_bounded(text)
            except UnsafeJson as error:
                raise SessionError(400, f"{where}.tool_calls[{j}].function.arguments: {error}") from None
            calls.append({"id": call.get("id"), "name": function["name"], "arguments": arguments})
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


@dataclass
class Session:
    session_id: str
    token: str
    max_response_tokens: int
    max_turns: int
    task_ids: list[int]
    """The task's prompt ids, as the rollout encoded them: the trajectory's prompt begins with
    exactly these, whatever the agent sends."""
    task_text: str
    """Their text, as the agent was given it: the first request's messages must begin with it."""
    max_prompt_tokens: int
    """The prompt (the task and what the first request adds after it) is at most this long."""
    max_total_tokens: int
    """Prompt and response together are at most this long."""
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """Every message so far, normalized, the model's own answers included."""
    trajectory: AgentTrajectory | None = None
    last_answer_at: float = 0.0
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    recent: deque[float] = field(default_factory=deque)
    """When its latest requests arrived (the rate limit)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """temperature / top_p / seed set by whoever opened it: they win over the request's (a run
    trains at its own temperature, whatever the agent asks for)."""

    def response_budget(self) -> int:
        """How long the response may grow: ``max_response_tokens``, less where the prompt leaves
        less than that of ``max_total_tokens``."""
        prompt = len(self.trajectory.prompt_ids) if self.trajectory is not None else len(self.task_ids)
        return min(self.max_response_tokens, self.max_total_tokens - prompt)

    def new_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What ``messages`` adds after the transcript; ``SessionError`` (409) if it does not
        repeat the transcript, or adds anything but tool and user messages."""
        for i, known in enumerate(self.transcript):
            if i >= len(messages) or messages[i] != known:
                raise SessionError(
                    409, f"messages[{i}] differs from this session's history: a session only grows at its end"
                )
        added = messages[len(self.transcript) :]
        if not added:
            raise SessionError(400, "no new message after the session's history")
        for j, message in enumerate(added, start=len(self.transcript)):
            if message["role"] == "assistant":
                raise SessionError(409, f"messages[{j}]: an assistant message this session's model did not write")
            if message["role"] == "system" and self.transcript:
                raise SessionError(409, f"messages[{j}]: a system message after the conversation began")
        return added


ENDED_TOKENS_KEPT = 1 << 16
"""How many ended sessions' tokens are remembered, to answer them 410 rather than 401."""


class SessionStore:
    """Open sessions by id and by token; thread-safe."""

    def __init__(self, max_requests_per_second: float = 50.0) -> None:
        self._by_id: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        """Tokens of the latest closed sessions: an agent past its deadline is told it has ended."""
        self._lock = threading.Lock()
        self.max_requests_per_second = max_requests_per_second

    def open(
        self,
        session_id: str,
        max_response_tokens: int,
        max_turns: int,
        sampling: dict[str, Any] | None = None,
        *,
        task_ids: list[int],
        task_text: str,
        max_prompt_tokens: int,
        max_total_tokens: int | None = None,
    ) -> Session:
        """A session for one task: its trajectory's prompt begins with ``task_ids``, and the first
        request's messages with ``task_text``. ``sampling`` (temperature, top_p, seed), when
        given, wins over what requests ask for. ``max_total_tokens`` None:
        ``max_prompt_tokens + max_response_tokens``."""
        total = max_prompt_tokens + max_response_tokens if max_total_tokens is None else max_total_tokens
        token = f"rlt-{secrets.token_urlsafe(24)}"
        session = Session(session_id, token, max_response_tokens, max_turns, list(task_ids), task_text, max_prompt_tokens, total)
        session.sampling = dict(sampling or {})
        with self._lock:
            if session_id in self._by_id:
                raise SessionError(409, f"session {session_id!r} is already open")
            self._by_id[session_id] = session
            self._by_token[session.token] = session
            return session

    def token_of(self, session_id: str) -> str:
        with self._lock:
            session = self._by_id.get(session_id)
        if session is None:
            raise SessionError(404, f"no open session {session_id!r}")
        return session.token

    def authenticate(self, authorization: str | None) -> Session:
        """The session of a ``Bearer`` token: 401 when it is missing or unknown."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise SessionError(401, "missing bearer token: each session has its own (the API key it was given)", "invalid_api_key")
        with self._lock:
            session = self._by_token.get(token.strip())
            ended = session is None and token.strip() in self._ended
        if ended:
            raise SessionError(410, "this session has ended", "session_ended")
        if session is None:
            raise SessionError(401, "unknown session token", "invalid_api_key")
        return session

    def admit(self, session: Session, now: float | None = None) -> None:
        """The rate limit: 429 beyond ``max_requests_per_second`` over the last second."""
        now = time.monotonic() if now is None else now
        while session.recent and now - session.recent[0] > 1.0:
            session.recent.popleft()
        if len(session.recent) >= self.max_requests_per_second:
            raise SessionError(429, f"more than {self.max_requests_per_second:g} requests in one second", "rate_limit_exceeded")
        session.recent.append(now)

    def close(self, session_id: str) -> Session:
        with self._lock:
            session = self._by_id.pop(session_id, None)
            if session is None:
                raise SessionError(404, f"no open session {session_id!r}")
            self._by_token.pop(session.token, None)
            self._ended[session.token] = None
            while len(self._ended) > ENDED_TOKENS_KEPT:
                self._ended.popitem(last=False)
        session.ended = True
        return session

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


def tool_call_record(name: str, seconds: float) -> ToolCallRecord:
    """A call the black-box agent made: the gateway sees its name and how long until its answer
    came back, not whether the agent's own tool failed."""
    return ToolCallRecord(name, False, seconds)
