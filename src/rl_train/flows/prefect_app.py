"""Prefect's API app for the temporary server, answering its own SQLite lock conflicts at once.

Prefect's server on SQLite opens deferred transactions. When one of them must write while
another connection holds the write lock (the task-run recorder and the event persister write
in the background as a run's events arrive), SQLite fails it at once with ``SQLITE_BUSY``
instead of waiting, and the server answers 503. Prefect's client then sleeps 2**n seconds
(2, 4, 8 ...) before trying again. Measured on two cores: a global step's sub-flow met such
a 503 on most steps, and waited 2-3 s for the client's back-off, where the lock had been
free again within milliseconds.

``RetryBusyDatabase`` wraps Prefect's own ASGI app and retries a 503 inside the server after
a few milliseconds (doubling up to ``budget_seconds`` in all), with the request's body
replayed. A 503 means the server rolled the transaction back (that is what the client's own
retry assumes too), so a retry here is the same request the client would send, seconds
sooner. When the budget is spent, the 503 goes to the client with a short ``Retry-After``
instead of its exponential back-off. Responses that are not 503 pass through unbuffered, and
websockets (the events stream) are not touched.

``rl-train``'s temporary API (``flows/prefect_api.py``) serves ``create_app`` below; a user's
own ``prefect server start`` is Prefect's app as it is (Postgres avoids the conflict).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

SERVICE_UNAVAILABLE = 503
FIRST_DELAY_SECONDS = 0.005
BUDGET_SECONDS = 2.0
"""Longest a request waits here in all before its 503 goes to the client."""
CLIENT_RETRY_AFTER = "0.1"
"""``Retry-After`` on a 503 that outlived the budget (the client's own back-off is 2 s, then 4)."""


class RetryBusyDatabase:
    """ASGI middleware: an HTTP request that the inner app answers 503 is sent to it again."""

    def __init__(
        self, app: ASGIApp, first_delay_seconds: float = FIRST_DELAY_SECONDS, budget_seconds: float = BUDGET_SECONDS
    ) -> None:
        self.app = app
        self.first_delay_seconds = first_delay_seconds
        self.budget_seconds = budget_seconds
        self.retries = 0
        """Requests answered again after a 503 (for tests and the bench)."""

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        delay, waited = self.first_delay_seconds, 0.0
        while True:
            last = waited + delay > self.budget_seconds
            if not await self._attempt(scope, body, receive, send, last):
                return
            self.retries += 1
            await asyncio.sleep(delay)
            waited += delay
            delay *= 2

    async def _attempt(self, scope: MutableMapping[str, Any], body: bytes, receive: Receive, send: Send, last: bool) -> bool:
        """One pass through the inner app; True when it answered 503 and is to be asked again
        (its answer then went nowhere)."""
        replayed = False
        busy = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, if it comes

        async def forward(message: Message) -> None:
            nonlocal busy
            if message["type"] == "http.response.start" and message["status"] == SERVICE_UNAVAILABLE:
                if not last:
                    busy = True
                    return
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"retry-after"]
                message = {**message, "headers": [*headers, (b"retry-after", CLIENT_RETRY_AFTER.encode())]}
            if not busy:
                await send(message)

        try:
            await self.app(dict(scope), replay, forward)  # routing rewrites the path in its scope
        except Exception:
            # Starlette raises the error again after its handler has answered 503: a 503 held
            # back here is retried; anything else is the inner app's to report
            if not busy:
                raise
        return busy


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away before sending it all
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def create_app() -> RetryBusyDatabase:
    """Prefect's API app (ephemeral, as its own temporary server builds it) behind the retry."""
    from prefect.server.api.server import create_app as prefect_app

    return RetryBusyDatabase(prefect_app())
