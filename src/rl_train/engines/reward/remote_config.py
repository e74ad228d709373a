"""The ``reward.remote`` section: rewards behind an HTTP endpoint, defined by name (``remote.py``).

Kept apart from ``remote.py`` so that loading a config imports no HTTP client.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from rl_train.algorithms.config import StrictModel

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward
    from rl_train.engines.reward.config import RewardSettings

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) stays on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RemoteRewardConfig(StrictModel):
    holds_model: ClassVar[bool] = False
    """The model, if any, is behind the endpoint."""
    url: str
    """The scoring endpoint, e.g. http://127.0.0.1:8731/v1/score (what `rl-train serve-reward` prints)."""
    timeout_s: float = Field(30.0, gt=0)
    """Limit of one request (connecting, sending, the whole answer), seconds; past it the request counts as a transport error."""
    max_retries: int = Field(3, ge=0)
    """Times a request is sent again after a transport error, a timeout, a 5xx or a 429; then its samples are is_infra."""
    backoff_s: float = Field(0.5, ge=0)
    """Wait before the first retry, doubled before each next one (a 429's or 503's Retry-After instead, when longer), seconds."""
    max_backoff_s: float = Field(10.0, ge=0)
    """Longest wait between two tries, Retry-After included, seconds."""
    max_concurrency: int = Field(4, ge=1)
    """Requests in flight at once from one reward worker."""
    batch_size: int = Field(64, ge=1)
    """Trajectories per request: a batch is sent in chunks of this many."""
    api_key_env: str | None = None
    """The environment variable holding the endpoint's bearer token, read in the reward worker (never the key itself: a config is saved with the run); None: no token sent."""
    max_response_bytes: int = Field(16 << 20, ge=1024)
    """Largest answer read; a longer one is a malformed answer (is_infra)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"got {value!r}: an http:// or https:// URL with a host, e.g. http://127.0.0.1:8731/v1/score")
        if parts.username or parts.password:
            raise ValueError(f"got {parts.scheme}://...@{parts.hostname}: no credentials in the URL (a config is saved with the run); name an environment variable in api_key_env")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError(f"got {value!r}: the name of an environment variable (letters, digits, '_'), not the key itself")
        return value

    def build(self, name: str, settings: RewardSettings) -> BatchReward:
        """The client (its token read from ``api_key_env`` now, in the worker)."""
        from rl_train.engines.reward.remote import RemoteReward

        return RemoteReward.from_config(name, self)
