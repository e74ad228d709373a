"""What a remote reward and ``rl-train serve-reward`` say to each other: JSON, version 1.

Never pickle: both sides parse what they receive as untrusted JSON (``safe_json.loads_bounded``:
bounded depth, finite numbers, int64 integers, valid Unicode), then check its shape strictly; a
key that is not in the schema is refused, not ignored.

The request, ``POST <url>`` with ``Content-Type: application/json`` (and ``Authorization:
Bearer <token>`` where the server has a token)::

    {"version": 1,
     "trajectories": [                          1 to the server's max_batch of them
       {"prompt": str, "response": str, "data_source": str, "ground_truth": str,
        "graded_text": str,                     optional, default: response
        "transcript": str,                      optional, default: response
        "extra": {str: JSON},                   optional, default {}: the row's other columns
        "tool_calls": [{"name": str, "error": bool, "seconds": number}],   optional, default []
        "turns": int >= 1,                      optional, default 1
        "messages": [{"role": str, "content": str}],   optional, default []: the response's turns
        "stop_reason": str}]}                   optional, default ""

(the fields of ``base.Trajectory``). The answer, 200::

    {"version": 1,
     "results": [                               exactly one per trajectory, in order
       {"score": number,                        finite; 0 where is_infra
        "sub_scores": {str: number},            finite
        "is_infra": bool,
        "reason": str}]}                        why it is infra ("" otherwise)

An error is a 4xx or 5xx with ``{"error": {"message": str, "code": str}}``: 400 a request
that is not this schema, 401 a missing or wrong token, 413 a body over the server's cap, 408
a body too slow to arrive, 503 the server busy (with ``Retry-After``). A server speaking a
later version answers a request of version 1 as version 1, or refuses it with 400.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rl_train.engines.agent.safe_json import UnsafeJson, loads_bounded
from rl_train.engines.reward.base import Message, RewardResult, ToolCall, Trajectory, freeze

WIRE_VERSION = 1

TRAJECTORY_KEYS = frozenset(
    {"prompt", "response", "data_source", "ground_truth", "graded_text", "transcript", "extra", "tool_calls", "turns", "messages", "stop_reason"}
)
REQUIRED_KEYS = ("prompt", "response", "data_source", "ground_truth")
RESULT_KEYS = frozenset({"score", "sub_scores", "is_infra", "reason"})


class WireError(ValueError):
    """A message that is not the schema above; the text names the field at fault."""


# -- the client's side ----------------------------------------------------------------------
def encode_request(trajectories: Sequence[Trajectory]) -> bytes:
    """The request body for ``trajectories`` (a row's column that JSON cannot hold is a
    ``TypeError``: the data, not the transport, is wrong)."""
    body = {"version": WIRE_VERSION, "trajectories": [_trajectory_json(t) for t in trajectories]}
    return json.dumps(body, ensure_ascii=False, allow_nan=False, default=_plain).encode("utf-8")


def _trajectory_json(t: Trajectory) -> dict[str, Any]:
    return {
        "prompt": t.prompt, "response": t.response, "data_source": t.data_source, "ground_truth": t.ground_truth,
        "graded_text": t.graded_text, "transcript": t.transcript, "extra": _thaw(t.extra),
        "tool_calls": [{"name": c.name, "error": c.error, "seconds": c.seconds} for c in t.tool_calls],
        "turns": t.turns, "stop_reason": t.stop_reason,
        "messages": [{"role": m.role, "content": m.content} for m in t.messages],
    }  # fmt: skip


def _thaw(value: Any) -> Any:
    """A frozen row value (``base.freeze``) as JSON's dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """A numpy scalar or array (as Parquet rows may hold) as plain numbers and lists."""
    for method in ("tolist", "item"):
        convert = getattr(value, method, None)
        if callable(convert):
            return convert()
    raise TypeError(f"a row value of type {type(value).__name__} cannot be sent as JSON: {value!r:.80}")


def decode_results(raw: bytes, expected: int) -> list[RewardResult]:
    """The server's answer to a request of ``expected`` trajectories, or ``WireError``."""
    try:
        body = loads_bounded(raw.decode("utf-8"))
    except (UnicodeDecodeError, UnsafeJson) as error:
        raise WireError(f"the answer is not JSON: {error}") from None
    if not isinstance(body, dict) or set(body) != {"version", "results"}:
        raise WireError(f"the answer is not {{'version', 'results'}}: {_preview(body)}")
    if body["version"] != WIRE_VERSION:
        raise WireError(f"version: got {_preview(body['version'])}, expected {WIRE_VERSION}")
    results = body["results"]
    if not isinstance(results, list) or len(results) != expected:
        count = len(results) if isinstance(results, list) else type(results).__name__
        raise WireError(f"results: got {count}, expected a list of {expected} (one per trajectory)")
    return [_result(r, f"results[{i}]") for i, r in enumerate(results)]


def _result(value: Any, where: str) -> RewardResult:
    if not isinstance(value, dict) or not {"score"} <= set(value) <= RESULT_KEYS:
        raise WireError(f"{where}: got {_preview(value)}; a result is an object with score and only {sorted(RESULT_KEYS)}")
    score = _number(value["score"], f"{where}.score")
    subs = value.get("sub_scores", {})
    if not isinstance(subs, dict):
        raise WireError(f"{where}.sub_scores: got {_preview(subs)}, expected an object of numbers")
    sub_scores = {k: _number(v, f"{where}.sub_scores.{k}") for k, v in subs.items()}
    is_infra = value.get("is_infra", False)
    reason = value.get("reason", "")
    if not isinstance(is_infra, bool) or not isinstance(reason, str):
        raise WireError(f"{where}: is_infra is a boolean and reason a string; got {_preview(is_infra)}, {_preview(reason)}")
    if is_infra:
        return RewardResult.infra(f"remote: {reason}" if reason else "remote: no verdict", sub_scores)
    return RewardResult(score, sub_scores)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WireError(f"{where}: got {_preview(value)}, expected a finite number")
    return float(value)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- the server's side ----------------------------------------------------------------------
def decode_request(body: Any, max_batch: int) -> list[Trajectory]:
    """The trajectories of a parsed request body, or ``WireError`` naming the field at fault."""
    if not isinstance(body, dict) or set(body) != {"version", "trajectories"}:
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise WireError(f"the body: got {keys}, expected an object of exactly 'version' and 'trajectories'")
    if body["version"] != WIRE_VERSION:
        raise WireError(f"version: got {_preview(body['version'])}; this server speaks version {WIRE_VERSION}")
    items = body["trajectories"]
    if not isinstance(items, list) or not 1 <= len(items) <= max_batch:
        count = len(items) if isinstance(items, list) else type(items).__name__
        raise WireError(f"trajectories: got {count}, expected a list of 1 to {max_batch}")
    return [_trajectory(item, f"trajectories[{i}]") for i, item in enumerate(items)]


def _trajectory(item: Any, where: str) -> Trajectory:
    if not isinstance(item, dict):
        raise WireError(f"{where}: got {type(item).__name__}, expected an object")
    unknown = sorted(set(item) - TRAJECTORY_KEYS)
    missing = [k for k in REQUIRED_KEYS if k not in item]
    if unknown or missing:
        raise WireError(f"{where}: unknown keys {unknown}, missing keys {missing}; allowed: {sorted(TRAJECTORY_KEYS)}")
    defaults = {"graded_text": item["response"], "transcript": item["response"], "stop_reason": ""}
    text: dict[str, str] = {}
    for key in (*REQUIRED_KEYS, *defaults):
        value = item.get(key, defaults.get(key))
        if not isinstance(value, str):
            raise WireError(f"{where}.{key}: got {type(value).__name__}, expected a string")
        text[key] = value
    extra, turns = item.get("extra", {}), item.get("turns", 1)
    if not isinstance(extra, dict):
        raise WireError(f"{where}.extra: got {type(extra).__name__}, expected an object")
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise WireError(f"{where}.turns: got {_preview(turns)}, expected an integer >= 1")
    return Trajectory(
        prompt=text["prompt"],
        response=text["response"],
        graded_text=text["graded_text"],
        transcript=text["transcript"],
        data_source=text["data_source"],
        ground_truth=text["ground_truth"],
        stop_reason=text["stop_reason"],
        extra=freeze(extra),
        tool_calls=_tool_calls(item.get("tool_calls", []), where),
        turns=turns,
        messages=_messages(item.get("messages", []), where),
    )


def _messages(value: Any, where: str) -> tuple[Message, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}.messages: got {type(value).__name__}, expected a list")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise WireError(f"{where}.messages[{i}]: got {_preview(message)}, expected an object of exactly role, content")
        if not isinstance(message["role"], str) or not isinstance(message["content"], str):
            raise WireError(f"{where}.messages[{i}]: role and content are strings")
        messages.append(Message(message["role"], message["content"]))
    return tuple(messages)


def _tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}.tool_calls: got {type(value).__name__}, expected a list")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict) or set(call) != {"name", "error", "seconds"}:
            raise WireError(f"{at}: got {_preview(call)}, expected an object of exactly name, error, seconds")
        if not isinstance(call["name"], str) or not isinstance(call["error"], bool):
            raise WireError(f"{at}: name is a string and error a boolean")
        calls.append(ToolCall(call["name"], call["error"], _number(call["seconds"], f"{at}.seconds")))
    return tuple(calls)


def encode_results(results: Sequence[RewardResult]) -> dict[str, Any]:
    """The answer's body (numbers are finite: ``score_all`` checked them)."""
    return {
        "version": WIRE_VERSION,
        "results": [
            {"score": r.score, "sub_scores": dict(r.sub_scores), "is_infra": r.is_infra, "reason": r.reason} for r in results
        ],
    }
