"""A reward behind an HTTP endpoint (R-6.1, R-6.5): any reward, served by ``rl-train
serve-reward`` (``remote_server.py``) or by anything else speaking ``wire.py``'s JSON.

An entry of ``reward.remote`` (``remote_config.RemoteRewardConfig``), routed by name like any
reward. A batch is sent in chunks of ``batch_size`` trajectories, at most ``max_concurrency``
requests in flight at once from one worker (one thread each, one connection each). Each
request is bounded by ``timeout_s`` in all (connecting, sending, the whole answer); a
transport error, a timeout, a 5xx or a 429 is tried again up to ``max_retries`` times, after
``backoff_s`` doubled each time (or the server's ``Retry-After`` when longer, at most
``max_backoff_s``). The worst case for one chunk is therefore about (max_retries + 1) x
timeout_s plus the waits.

Nothing the server says is trusted: the answer is read up to ``max_response_bytes``, parsed
as untrusted JSON and checked strictly (one result per trajectory, finite numbers, the
schema's keys and types only, ``wire.decode_results``). A malformed answer, another 4xx, or a
transport failure after the retries makes every trajectory of its chunk
``RewardResult.infra(reason)``: never a score, never an exception (the router then retries
infra samples, ``reward.max_infra_retries``). The bearer token is read from the environment
variable ``api_key_env`` names, in the worker; a config never holds it (sent over plain
http:// beyond loopback, it is warned of). Redirects are not followed, and the environment's
proxy settings are not used (``trust_env=False``): the request goes where the config says.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx

from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.remote_config import RemoteRewardConfig, is_loopback
from rl_train.engines.reward.wire import WireError, decode_results, encode_request

log = logging.getLogger(__name__)

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers that say "not now" rather than "no": tried again (other 5xx too)."""


class _Unreadable(Exception):
    """An answer that cannot be read as one: past the size cap (not retried) or past the deadline."""

    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry


class RemoteReward:
    """A ``BatchReward`` whose scores come from ``config.url``."""

    concurrent = True
    """Scored from several threads at once (``RewardRouter.exclusive``): the client and the pool are thread-safe."""

    def __init__(self, name: str, config: RemoteRewardConfig, token: str | None = None) -> None:
        self.name = name
        self.config = config
        headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency),
            headers=headers,
            follow_redirects=False,
            trust_env=False,
        )
        self._pool = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix=f"remote-{name}")

    @classmethod
    def from_config(cls, name: str, config: RemoteRewardConfig) -> RemoteReward:
        """The client, its token read from ``api_key_env`` (unset: a clear error at the worker's start)."""
        token = None
        if config.api_key_env is not None:
            token = os.environ.get(config.api_key_env)
            if not token:
                raise ValueError(
                    f"reward.remote.{name}.api_key_env: the environment variable {config.api_key_env} is not set "
                    "(or empty) where the reward workers run; set it there, or set api_key_env to null for no token"
                )
        url = urlsplit(config.url)
        if token and url.scheme == "http" and not is_loopback(url.hostname or ""):
            log.warning(
                "reward.remote.%s sends its bearer token in clear text to %s (http://): anyone on the path can "
                "read it; use https:// beyond a trusted network", name, url.hostname,
            )  # fmt: skip
        return cls(name, config, token)

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One result per trajectory, in order; chunks of ``batch_size``, ``max_concurrency`` at once."""
        size = self.config.batch_size
        chunks = [list(trajectories[i : i + size]) for i in range(0, len(trajectories), size)]
        return [result for part in self._pool.map(self._score_chunk, chunks) for result in part]

    def _score_chunk(self, chunk: list[Trajectory]) -> list[RewardResult]:
        body = encode_request(chunk)
        answer = self._post(body)
        if isinstance(answer, str):
            return [RewardResult.infra(answer) for _ in chunk]
        try:
            return decode_results(answer, len(chunk))
        except WireError as error:
            return [RewardResult.infra(f"remote reward {self.name!r}: malformed answer: {error}") for _ in chunk]

    def _post(self, body: bytes) -> bytes | str:
        """The 200 answer's body, or why there is none after the retries."""
        where = f"remote reward {self.name!r} ({self.config.url})"
        reason, retry_after = "", None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self._backoff(attempt, retry_after))
                retry_after = None
            try:
                status, raw, retry_after = self._send(body)
            except httpx.TransportError as error:  # connect, read, write and pool errors and timeouts
                reason = f"{where}: {type(error).__name__}: {error or 'no detail'}"
                continue
            except _Unreadable as error:
                reason = f"{where}: {error.reason}"
                if error.retry:
                    continue
                return reason
            if status == 200:
                return raw
            reason = f"{where}: HTTP {status}: {_excerpt(raw)}"
            if status not in RETRIED_STATUSES and status < 500:
                return reason
        return f"{reason} (after {self.config.max_retries + 1} tries)"

    def _send(self, body: bytes) -> tuple[int, bytes, float | None]:
        """(status, body, Retry-After seconds) of one request, read within ``timeout_s`` and the size cap."""
        deadline = time.monotonic() + self.config.timeout_s
        cap = self.config.max_response_bytes
        with self._client.stream("POST", self.config.url, content=body) as response:
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise _Unreadable(f"the answer is over max_response_bytes ({cap})", retry=False)
                if time.monotonic() > deadline:
                    raise _Unreadable(f"no whole answer within timeout_s ({self.config.timeout_s:g} s)", retry=True)
                chunks.append(chunk)
            return response.status_code, b"".join(chunks), _seconds(response.headers.get("retry-after"))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = self.config.backoff_s * 2 ** (attempt - 1)
        return min(max(wait, retry_after or 0.0), self.config.max_backoff_s)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` in seconds (its date form is not used by our server, and ignored)."""
    try:
        seconds = float(header) if header is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def _excerpt(raw: bytes, limit: int = 200) -> str:
    text = raw[: limit * 4].decode("utf-8", errors="replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")
