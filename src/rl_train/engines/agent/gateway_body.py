"""An agent's request body, read as if it were hostile (it may be).

``read_body`` counts the bytes as they arrive, a chunked body included, and refuses (413) as
soon as the count passes the cap: the rest is never read, so the server holds at most the cap
(plus the transport's own small read-ahead, which uvicorn pauses past 64 KiB). A declared
``Content-Length`` over the cap is refused before a byte of the body is read, and a body that
trickles in slower than ``timeout_s`` allows is refused (408). ``parse_body`` is
``safe_json.loads_bounded`` on the bytes: any shape of malformed JSON is a 400, never a 500.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from rl_train.engines.agent.safe_json import INT64_DIGITS, UnsafeJson, loads_bounded
from rl_train.engines.agent.sessions import SessionError


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, or ``SessionError``: 413 the moment it is over ``max_bytes``."""
    too_large = SessionError(413, f"request body over {max_bytes} bytes", "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and (len(declared) > INT64_DIGITS or (declared.isdigit() and int(declared) > max_bytes)):
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise SessionError(408, f"the request body took longer than {timeout_s:g} s to arrive", "request_timeout") from None
    except ClientDisconnect:
        raise SessionError(400, "the client went away before its body arrived", "client_disconnected") from None
    return b"".join(chunks)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ``SessionError`` (400) naming what is wrong with it."""
    try:
        body = loads_bounded(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise SessionError(400, f"the body is not UTF-8: {error.reason} at byte {error.start}", "invalid_json") from None
    except UnsafeJson as error:
        raise SessionError(400, f"the body: {error}", "invalid_json") from None
    if not isinstance(body, dict):
        raise SessionError(400, f"the body is a JSON object, got {type(body).__name__}", "invalid_json")
    return body
