"""The OpenAI-compatible gateway (R-5.5): an HTTP front for black-box agents.

``/v1/chat/completions`` (streaming or not, with ``tools`` / ``tool_calls``) and ``/v1/models``,
served by FastAPI; the work is ``GatewayCore``'s. Every request needs its session's bearer
token (the API key the agent was given): a missing or unknown token is 401, a token used on
another session's history is refused by the session (409), and neither changes anything.
Requests are bounded: a body over ``max_body_bytes`` is 413, more than the session's rate is
429, a body that is not a JSON object is 400 with the parser's reason. Errors have OpenAI's
shape, ``{"error": {"message", "type", "code"}}``.

A stream is OpenAI's server-sent events: a first chunk with the role, one chunk per generated
token of text (or one with the tool call), a last chunk with the finish reason, then
``[DONE]``. The turn is generated before it streams: the built-in engine decodes a batch at a
time, so the chunks come as fast as the client reads them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from rl_train.engines.agent.gateway_core import ChatTurn, GatewayCore
from rl_train.engines.agent.sessions import SessionError

MAX_BODY_BYTES = 1 << 20


def _error(status: int, message: str) -> JSONResponse:
    kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(status, "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_gateway(core: GatewayCore, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="rl-train gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(SessionError)
    async def session_error(request: Request, error: SessionError) -> JSONResponse:
        return _error(error.status, error.message)

    @app.get("/v1/models")
    def models(request: Request) -> dict[str, Any]:
        core.store.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": core.model_name, "object": "model", "created": 0, "owned_by": "rl-train"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Any:
        session = core.store.authenticate(request.headers.get("authorization"))
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return _error(413, f"request body over {max_body_bytes} bytes")
        raw = await request.body()
        if len(raw) > max_body_bytes:
            return _error(413, f"request body over {max_body_bytes} bytes")
        core.store.admit(session)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return _error(400, f"the body is not JSON: {error}")
        if not isinstance(body, dict):
            return _error(400, f"the body is a JSON object, got {type(body).__name__}")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            return _error(400, f"stream: got {stream!r}; allowed: true or false")
        turn = await run_in_threadpool(core.chat, session, body)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if stream:
            return StreamingResponse(_chunks(core, turn, completion_id), media_type="text/event-stream")
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

    return app


def _chunks(core: GatewayCore, turn: ChatTurn, completion_id: str) -> Iterator[str]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": core.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    calls = turn.message.get("tool_calls")
    if calls:
        if turn.message.get("content"):
            yield chunk({"content": turn.message["content"]})
        yield chunk({"tool_calls": [{"index": 0, **calls[0]}]})
    else:
        for token in turn.token_ids:
            piece = core.tokenizer.decode([token], skip_special_tokens=True)
            if piece:
                yield chunk({"content": piece})
    yield chunk({}, turn.finish_reason)
    yield "data: [DONE]\n\n"
