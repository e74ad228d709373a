"""The temporary API's retry of Prefect's SQLite lock conflicts: a 503 is asked again inside the
server with the request's body replayed, anything else passes through as it is, and a 503
that outlives the budget reaches the client with a short Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rl_train.flows.prefect_app import CLIENT_RETRY_AFTER, RetryBusyDatabase


class BusyThenOk:
    """An ASGI app that answers 503 ``busy`` times (raising afterwards, as Starlette does once
    its error handler has answered), then 201 with the body it read; it rewrites the scope's
    path as routing does."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.bodies: list[bytes] = []
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        scope["path"] = "/rewritten"
        message = await receive()
        self.bodies.append(message["body"])
        if len(self.bodies) <= self.busy:
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"exception_message":"Service Unavailable"}'})
            raise RuntimeError("database is locked")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"created:" + message["body"]})


def call(app: Any, body_parts: list[bytes]) -> list[dict[str, Any]]:
    """Send one POST in ``body_parts`` chunks through ``app``; the messages it sent back."""
    incoming = [
        {"type": "http.request", "body": part, "more_body": i < len(body_parts) - 1} for i, part in enumerate(body_parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)  # no disconnect during the test
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/task_runs/", "headers": []}
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_busy_database_is_asked_again_with_the_same_body_and_path() -> None:
    inner = BusyThenOk(busy=3)
    app = RetryBusyDatabase(inner, first_delay_seconds=0.001)
    sent = call(app, [b'{"name":', b'"phase"}'])
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [201]  # no 503 reached the client
    assert sent[-1]["body"] == b'created:{"name":"phase"}'
    assert inner.bodies == [b'{"name":"phase"}'] * 4 and inner.paths == ["/api/task_runs/"] * 4
    assert app.retries == 3


def test_other_answers_pass_through_untouched() -> None:
    inner = BusyThenOk(busy=0)
    app = RetryBusyDatabase(inner)
    sent = call(app, [b"x"])
    assert sent == [
        {"type": "http.response.start", "status": 201, "headers": []},
        {"type": "http.response.body", "body": b"created:x"},
    ]
    assert app.retries == 0


def test_a_503_past_the_budget_reaches_the_client_with_a_short_retry_after() -> None:
    inner = BusyThenOk(busy=100)
    # waits of 0.01 and 0.02 s fit the 0.05 s budget, a third (0.04) would not: the third answer is sent
    app = RetryBusyDatabase(inner, first_delay_seconds=0.01, budget_seconds=0.05)
    try:
        call(app, [b"x"])
    except RuntimeError as exc:  # the inner app's own error, raised after its 503 was sent
        assert "locked" in str(exc)
    else:
        raise AssertionError("the last attempt's error should propagate")
    assert len(inner.bodies) == 3 and app.retries == 2


def test_a_503_past_the_budget_carries_retry_after() -> None:
    inner = BusyThenOk(busy=100)
    app = RetryBusyDatabase(inner, first_delay_seconds=0.01, budget_seconds=0.0)
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        with contextlib.suppress(RuntimeError):  # the inner app's error, after its 503
            await app({"type": "http", "method": "GET", "path": "/api/x", "headers": []}, receive, send)

    asyncio.run(run())
    start = sent[0]
    assert start["status"] == 503 and (b"retry-after", CLIENT_RETRY_AFTER.encode()) in start["headers"]


def test_websockets_are_not_touched() -> None:
    seen: list[str] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        return {}

    async def ignore(message: dict[str, Any]) -> None:
        return None

    asyncio.run(RetryBusyDatabase(inner)({"type": "websocket", "path": "/api/events/in"}, nothing, ignore))
    assert seen == ["websocket"]
