"""One layout of a multi-turn trajectory, shared by the tool loop and the gateway (R-5.6).

A trajectory is the prompt ids (the task's, as the rollout encoded them) and a response in which the
model's turns (its own token ids, each ending with end of sequence) alternate with what the
world said back, templated on its own and appended (``observation_ids``):

- a tool's answer: ``<tool_response>...</tool_response>``;
- a later user message: ``<user>...</user>``.

A model turn that calls a tool writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(``parse_tool_call``); the gateway shows it to an OpenAI client as ``tool_calls`` and keeps
the model's ids, never a re-tokenization of them.
"""

from __future__ import annotations

import re
from typing import Any

from rl_train.engines.agent.safe_json import UnsafeJson, loads_bounded

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN_CALL = "<tool_call>"


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | str | None:
    """The first tool call of a turn: (name, arguments); a message naming what is wrong with a
    malformed one; None when the turn calls no tool."""
    match = TOOL_CALL.search(text)
    if match is None:
        return "a <tool_call> without its closing </tool_call>" if OPEN_CALL in text else None
    try:
        call = loads_bounded(match.group(1))
    except UnsafeJson as error:
        return f"the tool call is {error}"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call is {"name": <tool>, "arguments": {...}}'
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return "the tool call's arguments are not an object"
    return call["name"], arguments


def text_before_call(text: str) -> str:
    """What a turn says before its tool call (all of it when it calls none)."""
    at = text.find(OPEN_CALL)
    return text if at < 0 else text[:at]


def tool_observation(text: str) -> str:
    return f"<tool_response>{text}</tool_response>"


def user_observation(text: str) -> str:
    return f"<user>{text}</user>"


def observation_ids(tokenizer: Any, text: str) -> list[int]:
    """An observation's ids, templated and tokenized on its own."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """BOS, then the prompt, as a rollout replica encodes a prompt."""
    return [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]


def generation_spans(mask: list[int]) -> list[list[int]]:
    """``[start, end)`` of each run of generated tokens (mask 1) in the response: one per turn."""
    spans: list[list[int]] = []
    for i, graded in enumerate(mask):
        if graded and (not spans or spans[-1][1] != i):
            spans.append([i, i + 1])
        elif graded:
            spans[-1][1] = i + 1
    return spans
