"""``rl-train serve-reward``: a config's rewards served over HTTP, for ``reward.remote`` clients.

One endpoint, ``POST /v1/score``, speaking ``wire.py``'s JSON (version 1). Each trajectory
is scored by the reward its data_source routes to under the served config's ``reward:``
section (``RewardRouter``: the same routing, the same infra retries as in training), so a
grader that needs a GPU or a sandbox the trainer lacks runs where it has them.

The request is not trusted; it passes, in this order:

1. **the token**, where the server has one: ``Authorization: Bearer <token>``, compared in
   constant time; missing or wrong is 401. A server bound to anything but a loopback address
   must have one (read from an environment variable, never from the command line, where
   other users can read it);
2. **the server's capacity**: past ``max_in_flight`` requests at once it is 503 with
   ``Retry-After``, at once (the client backs off and retries);
3. **the body's size**, counted as it arrives (``gateway_body.read_body``): past
   ``max_body_bytes`` it is 413 and the rest is never read; a body slower than
   ``body_timeout_s`` is 408;
4. **its JSON** (``gateway_body.parse_body``: bounded depth, finite numbers) and **its shape**
   (``wire.decode_request``: the schema's keys and types only, 1 to ``max_batch``
   trajectories), else 400 naming the field; then **its routes**: a data_source no reward
   routes is 400.

Scoring runs on threads, ``parallel`` batches at once (1 by default: a reward need not be
thread-safe, and a judge's engine takes one call at a time). A reward that raises is a bug
of the served reward: 500, logged here, which the client retries and then counts as infra.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rl_train.engines.agent.gateway_body import parse_body, read_body
from rl_train.engines.agent.sessions import SessionError
from rl_train.engines.agent.threaded_server import ThreadedServer
from rl_train.engines.reward.remote_config import is_loopback
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.reward.wire import WireError, decode_request, encode_results
from rl_train.registry import UnknownNameError

SCORE_PATH = "/v1/score"
TOKEN_ENV = "RL_TRAIN_REWARD_TOKEN"
"""The environment variable ``serve-reward`` reads its token from by default."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeLimits:
    """What one reward server accepts; each bound answers at once when passed."""

    max_body_bytes: int = 8 << 20
    """A request body's size (a batch of long trajectories is a few MiB)."""
    body_timeout_s: float = 30.0
    """How long a body may take to arrive."""
    max_batch: int = 1024
    """Trajectories in one request."""
    max_in_flight: int = 64
    """Requests admitted at once (reading, waiting for a scoring thread, scoring)."""
    parallel: int = 1
    """Batches scored at once, each on its own thread (more than 1 only for thread-safe rewards)."""
    retry_after_s: int = 1


@dataclass
class _Admission:
    """Requests in flight; touched from the event loop only."""

    limits: ServeLimits
    in_flight: int = 0
    threads: anyio.CapacityLimiter | None = field(default=None)


def _error(status: int, message: str, code: str, retry_after_s: int = 1) -> JSONResponse:
    headers = {"retry-after": str(retry_after_s)} if status in (429, 503) else {}
    if status == 401:
        headers["www-authenticate"] = "Bearer"
    return JSONResponse({"error": {"message": message, "code": code}}, status_code=status, headers=headers or None)


def create_reward_app(router: RewardRouter, limits: ServeLimits | None = None, token: str | None = None) -> FastAPI:
    """The app serving ``router``'s rewards; ``token``: the bearer token required (None: none)."""
    admission = _Admission(limits or ServeLimits())
    expected = f"Bearer {token}".encode() if token else None
    app = FastAPI(title="rl-train rewards", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(SessionError)
    async def refused(request: Request, error: SessionError) -> JSONResponse:
        return _error(error.status, error.message, error.code or "invalid_request", admission.limits.retry_after_s)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), "not_found" if error.status_code == 404 else "invalid_request")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return _error(500, "the reward server failed to score this request", "internal_error")

    @app.post(SCORE_PATH)
    async def score(request: Request) -> JSONResponse:
        given = request.headers.get("authorization", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            raise SessionError(401, "a missing or wrong bearer token", "unauthorized")
        if admission.in_flight >= admission.limits.max_in_flight:
            raise SessionError(503, f"the server has {admission.limits.max_in_flight} requests in flight; retry shortly", "server_busy")
        admission.in_flight += 1
        try:
            return await _score(router, admission, request)
        finally:
            admission.in_flight -= 1

    return app


async def _score(router: RewardRouter, admission: _Admission, request: Request) -> JSONResponse:
    """Steps 3 and 4 of the module's list, then the batch, on a scoring thread."""
    limits = admission.limits
    body = parse_body(await read_body(request, limits.max_body_bytes, limits.body_timeout_s))
    try:
        trajectories = decode_request(body, limits.max_batch)
    except WireError as error:
        raise SessionError(400, str(error), "invalid_request") from None
    for i, trajectory in enumerate(trajectories):
        try:
            router.route(trajectory.data_source)
        except UnknownNameError as error:
            raise SessionError(400, f"trajectories[{i}].data_source: {error}", "unknown_data_source") from None
    if admission.threads is None:
        admission.threads = anyio.CapacityLimiter(limits.parallel)
    try:
        results = await anyio.to_thread.run_sync(partial(router.score, trajectories), limiter=admission.threads)
    except Exception:
        log.exception("a served reward raised while scoring %d trajectories", len(trajectories))
        raise
    return JSONResponse(encode_results(results))


class RewardServer(ThreadedServer):
    """The app on a bound socket: ``start``/``stop`` from a thread (tests, a script), or
    ``serve`` in the foreground until SIGINT or SIGTERM (the CLI). The socket is closed before
    either returns, so no port outlives the server."""

    label = "reward server"

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, has_token: bool = False) -> None:
        if not is_loopback(host) and not has_token:
            raise ValueError(
                f"--host {host}: a reward server bound beyond loopback needs a token; set {TOKEN_ENV} "
                "(or the variable --token-env names) where it runs, and api_key_env in the clients' reward.remote entry"
            )
        super().__init__(app, host, port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{SCORE_PATH}"
