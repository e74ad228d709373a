"""The types of a chat request, checked before the gateway acts on one (and its OpenAPI schema).

The models are strict: a string is a string, an integer is not a boolean, no value is coerced.
Every integer is bounded (the seed to int64, as the engines hand it to ``torch``), and ``n`` is
1 (a session is one trajectory). Fields the gateway does not use are accepted and ignored, as
an OpenAI-compatible server's clients expect; fields it reads are all declared. What a request
*means* (its history, its prompt, its budget) is the session's to judge (``sessions.py``,
``gateway_core.py``): here only its shape.

``openapi_schema`` is the API's description with these models as the request body, for the
tests' fuzzer; the production app serves no schema (``openapi_url=None``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_train.engines.agent.safe_json import INT64_MAX
from rl_train.engines.agent.sessions import SessionError

MAX_TOKENS = (1 << 31) - 1
"""A request's ``max_tokens`` bound; the session's own budget is far smaller and wins."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: str = "text"
    text: str = ""


class FunctionCall(_Strict):
    name: str
    arguments: str | None = None


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionSpec(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class ChatRequest(_Strict):
    """``POST /v1/chat/completions``: the fields the gateway reads, each with its bounds."""

    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=1e-6, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    n: int | None = Field(None, ge=1, le=1)
    seed: int | None = Field(None, ge=0, le=INT64_MAX)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


def check_request(body: dict[str, Any]) -> ChatRequest:
    """``body`` as a ``ChatRequest``, or ``SessionError`` (400) naming the first wrong field, its
    value (cut short) and what is allowed."""
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
        shown = repr(first.get("input"))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise SessionError(400, f"{where or 'body'}: got {shown}; {first['msg']}{more}", "invalid_value", where or None) from None


def openapi_schema(app: FastAPI, model_name: str) -> dict[str, Any]:
    """The app's OpenAPI description, with ``ChatRequest`` as the chat route's body and bearer
    auth on every route: what a schema-driven fuzzer needs to aim at the real checks. It is
    narrower than what the gateway accepts, so that the fuzzer's valid requests get past the
    first checks: ``model`` is the one served, and the request objects list no fields beyond
    their own (others are ignored, and the fuzzer's invalid requests still send them)."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    body = ChatRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {}).update(body.pop("$defs", {}))
    components["schemas"]["ChatRequest"] = body
    for declared in components["schemas"].values():
        declared.setdefault("additionalProperties", False)
    body["properties"]["model"]["enum"] = [model_name]
    components["securitySchemes"] = {"session": {"type": "http", "scheme": "bearer"}}
    schema["security"] = [{"session": []}]
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    chat["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}}}
    return schema
