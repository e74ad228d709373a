"""The OpenAI-compatible gateway (R-5.5): an HTTP front for black-box agents.

``/v1/chat/completions`` (streaming or not, with ``tools`` / ``tool_calls``) and ``/v1/models``,
served by FastAPI; the work is ``GatewayCore``'s. The agent is not trusted, and nothing it
sends is acted on before it has passed, in this order:

1. **its session's bearer token** (the API key it was given): missing or unknown is 401;
2. **one request at a time per session**: a request while the session has one in flight is 409
   at once, so that a token cannot queue work (or hold threads) behind itself;
3. **the session's rate**: more than its requests per second is 429;
4. **the body's size**, counted while it is read, chunked or not: past ``max_body_bytes`` it is
   413 at once, and the rest is never read (``gateway_body.py``);
5. **its JSON**: any malformed shape is 400 (``safe_json.py``), then **its types and bounds**,
   strictly (``gateway_schema.py``): 400 naming the field;
6. **the model**: any name but the one served is 404 ``model_not_found``;
7. **the gateway's capacity**: past ``max_in_flight`` generations at once it is 503 with
   ``Retry-After``, at once.

What the request means (the history it repeats, the task its first request must begin with, the
prompt and total token caps) is then the session's to judge (``gateway_core.py``). Handlers are
async and hold no thread while they wait: only a generation runs on a thread, from a pool of
the gateway's own sized to ``max_in_flight``, so a flood of requests cannot take the threads that
other sessions need. Errors have OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``; no input gives a 5xx.

A stream is OpenAI's server-sent events: a first chunk with the role, one chunk per generated
token of text (or one with the tool call), a last chunk with the finish reason, then
``[DONE]``. The turn is generated, and its chunks written, before it streams: the built-in engine
decodes a batch at a time, so the chunks come as fast as the client reads them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from rl_train.engines.agent.gateway_body import parse_body, read_body
from rl_train.engines.agent.gateway_core import ChatTurn, GatewayCore
from rl_train.engines.agent.gateway_schema import check_request, openapi_schema
from rl_train.engines.agent.sessions import Session, SessionError


@dataclass(frozen=True)
class GatewayLimits:
    """What one gateway accepts; each bound answers at once when passed, never by waiting."""

    max_body_bytes: int = 1 << 20
    """A request body's size; the largest honest one is a long conversation's history."""
    body_timeout_s: float = 30.0
    """How long a body may take to arrive (a trickled body holds its session busy)."""
    max_in_flight: int = 256
    """Generations running at once across sessions (each holds one of the gateway's threads;
    the micro-batcher's largest batch)."""
    retry_after_s: int = 1
    """The ``Retry-After`` of a 429 or 503."""
    max_connections: int = 1024
    """Connections open at once (uvicorn's ``limit_concurrency``; past it, a plain 503): bounds
    what a flood of idle connections can hold, each at most the transport's 64 KiB read-ahead."""


_KINDS = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error", 503: "server_error"}


def _error(status: int, message: str, code: str | None = None, param: str | None = None, retry_after_s: int = 1) -> JSONResponse:
    kind = _KINDS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    headers = {"retry-after": str(retry_after_s)} if status in (429, 503) else None
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass
class _Admission:
    """Who is in flight; touched from the event loop only, so it needs no lock."""

    limits: GatewayLimits
    busy: set[str] = field(default_factory=set)
    """Tokens of the sessions with a request in flight."""
    generating: int = 0
    threads: anyio.CapacityLimiter | None = None
    """The gateway's own thread pool bound (made in the server's event loop, on first use)."""


def create_gateway(core: GatewayCore, limits: GatewayLimits | None = None) -> FastAPI:
    """The app. It serves no OpenAPI document and no docs: ``openapi_schema(app)`` builds one
    in process for the tests' fuzzer."""
    admission = _Admission(limits or GatewayLimits())
    app = FastAPI(title="rl-train gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.openapi = partial(openapi_schema, app, core.model_name)  # type: ignore[method-assign]

    @app.exception_handler(SessionError)
    async def session_error(request: Request, error: SessionError) -> JSONResponse:
        return _error(error.status, error.message, error.code, error.param, admission.limits.retry_after_s)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), "not_found" if error.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return _error(500, "the gateway failed to answer this request", "internal_error")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        core.store.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": core.model_name, "object": "model", "created": 0, "owned_by": "rl-train"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Any:
        session = core.store.authenticate(request.headers.get("authorization"))
        if session.token in admission.busy:
            raise SessionError(409, "this session already has a request in flight: one at a time", "session_busy")
        admission.busy.add(session.token)
        try:
            return await _complete(core, admission, session, request)
        finally:
            admission.busy.discard(session.token)

    return app


async def _complete(core: GatewayCore, admission: _Admission, session: Session, request: Request) -> Any:
    """Steps 3 to 7 of the module's list, then the turn, on one of the gateway's threads."""
    limits = admission.limits
    core.store.admit(session)
    body = parse_body(await read_body(request, limits.max_body_bytes, limits.body_timeout_s))
    stream = bool(check_request(body).stream)
    model = body["model"]
    if model != core.model_name:
        shown = model if len(model) <= 80 else model[:77] + "..."
        raise SessionError(404, f"The model `{shown}` does not exist: this gateway serves `{core.model_name}`", "model_not_found", "model")
    if admission.generating >= limits.max_in_flight:
        raise SessionError(503, f"the gateway is generating for {limits.max_in_flight} requests already; retry shortly", "server_busy")
    if admission.threads is None:
        admission.threads = anyio.CapacityLimiter(limits.max_in_flight)
    admission.generating += 1
    try:
        turn, completion_id, events = await anyio.to_thread.run_sync(partial(_turn, core, session, body, stream), limiter=admission.threads)
    finally:
        admission.generating -= 1
    if stream:
        return StreamingResponse(_replay(events), media_type="text/event-stream")
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": core.model_name,
        "choices": [{"index": 0, "message": turn.message, "finish_reason": turn.finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
        },
    }


def _turn(core: GatewayCore, session: Session, body: dict[str, Any], stream: bool) -> tuple[ChatTurn, str, list[str]]:
    """The turn, its completion id and, for a stream, its events: all the work that decodes
    tokens happens here, on the worker thread, none of it while the response is written."""
    turn = core.chat(session, body)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    return turn, completion_id, _chunks(core, turn, completion_id) if stream else []


async def _replay(chunks: list[str]) -> AsyncIterator[str]:
    for chunk in chunks:
        yield chunk


def _chunks(core: GatewayCore, turn: ChatTurn, completion_id: str) -> list[str]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": core.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    calls = turn.message.get("tool_calls")
    if calls:
        if turn.message.get("content"):
            out.append(chunk({"content": turn.message["content"]}))
        out.append(chunk({"tool_calls": [{"index": 0, **calls[0]}]}))
    else:
        for token in turn.token_ids:
            piece = core.tokenizer.decode([token], skip_special_tokens=True)
            if piece:
                out.append(chunk({"content": piece}))
    out.append(chunk({}, turn.finish_reason))
    out.append("data: [DONE]\n\n")
    return out
