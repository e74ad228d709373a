"""sglang's native HTTP API, as the rollout backend uses it (JSON in, JSON out).

Every failure to talk to the server becomes ``RolloutServerError`` naming the server, the
endpoint and what went wrong: not reachable, no answer within the timeout, an error status
(with the server's message), or a body that is not what the endpoint returns. The caller's
batch is never half-applied: a generate call either returns every result or raises, and the
rollout worker then hands its prompts back to the replay buffer.

Endpoints (sglang 0.5): ``/health``, ``/generate`` (token ids in; per output token its
log-prob and id out, ``meta_info.output_token_logprobs``), ``/abort_request``,
``/flush_cache``, ``/release_memory_occupation`` and ``/resume_memory_occupation`` (by tag:
``kv_cache``, ``weights``), ``/update_weights_from_disk``, ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group``,
``/get_weights_by_name``, and LoRA's ``/load_lora_adapter`` and ``/unload_lora_adapter`` (which
answer a refusal as ``{"success": false, "error_message": ...}``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class RolloutServerError(RuntimeError):
    """The rollout server could not be reached, did not answer in time, refused a request or
    answered with something malformed."""


class SglangClient:
    def __init__(self, url: str, connect_timeout_s: float = 10.0, request_timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            trust_env=False,  # a proxy from the environment must not sit between us and our server
        )

    def close(self) -> None:
        self._http.close()

    def call(self, endpoint: str, body: dict[str, Any] | None = None, *, method: str = "POST") -> Any:
        """The decoded JSON answer (its text when it is not JSON, None when empty), or
        ``RolloutServerError``."""
        where = f"sglang server {self.url}{endpoint}"
        try:
            response = self._http.request(method, endpoint, json=body)
        except httpx.TimeoutException as error:
            raise RolloutServerError(f"{where}: no answer within the timeout ({type(error).__name__})") from None
        except httpx.TransportError as error:
            raise RolloutServerError(f"{where}: not reachable ({error})") from None
        if response.status_code >= 400:
            raise RolloutServerError(f"{where}: HTTP {response.status_code}: {_message(response)}")
        if not response.content:
            return None
        try:
            return response.json()
        except json.JSONDecodeError:  # some endpoints answer plain text ("Cache flushed."); the
            return response.text  # callers of those that answer data check what they get

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False


def _message(response: httpx.Response) -> str:
    """The server's own error message: sglang answers ``{"message": ...}``, ``{"detail": ...}``
    or (its LoRA endpoints) ``{"error_message": ...}``."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        return response.text[:500]
    if isinstance(body, dict):
        for key in ("message", "error_message", "detail", "error"):
            if key in body:
                return str(body[key])
    return str(body)[:500]
