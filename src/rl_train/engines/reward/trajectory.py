"""A TransferQueue trajectory record (and its prompt's row) as the ``Trajectory`` a reward reads.

Only the graded tokens (response_mask == 1) are the model's (R-6.2). A multi-turn trajectory
(``agent_turns``) ends each turn with end of sequence, so its answer is its last turn: what
the model wrote after the last tool observation; ``graded_text`` is all its turns, and
``transcript`` the whole response with the tools' answers. ``messages`` splits the response
where its mask changes: each run of graded tokens is a model turn (an ``assistant`` message),
each run of observed ones a ``tool`` (or ``user``) message with the loop's markup taken off
(``engines/agent/chat.py`` is the layout), so that a reward model can put them in its own chat
template (R-6.3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import groupby
from typing import Any

from rl_train.engines.model.response_decoder import ResponseDecoder
from rl_train.engines.reward.base import ROW_FIELDS, Message, ToolCall, Trajectory, freeze

TRAJECTORY_FIELDS = ["response_ids", "group_id", "data_source", "ground_truth"]
"""What the reward worker reads of every trajectory record (never log-probs or versions)."""
OPTIONAL_TRAJECTORY_FIELDS = ["response_mask", "agent_turns", "tool_calls", "stop_reason"]
"""What a multi-turn trajectory adds, and how generation ended."""

OBSERVATIONS = (
    ("tool", re.compile(r"<tool_response>(.*)</tool_response>", re.S)),
    ("user", re.compile(r"<user>(.*)</user>", re.S)),
)
"""The markup the agent loop puts around what the world says back (``engines/agent/chat.py``),
by the role it is: a reward model reads the content in its own template's markup. An
observation in neither (one cut by the response budget) is a ``tool`` message as it is."""


def observation_message(text: str) -> Message:
    """An observation's text (a run of mask-0 tokens) as its chat message."""
    for role, pattern in OBSERVATIONS:
        match = pattern.fullmatch(text)
        if match:
            return Message(role, match.group(1))
    return Message("tool", text)


class TrajectoryReader:
    """Decodes records with the policy's tokenizer (stopping at its end of sequence)."""

    def __init__(self, decoder: ResponseDecoder) -> None:
        self.decoder = decoder
        self.eos_token_id = decoder.eos_token_id

    def response_text(self, record: Mapping[str, Any]) -> str:
        """The model's answer: its graded tokens up to end of sequence (the last turn of a
        multi-turn trajectory)."""
        ids = list(record["response_ids"])
        mask = list(record.get("response_mask") or [1] * len(ids))
        if "agent_turns" in record:
            last = max((i for i, graded in enumerate(mask) if not graded), default=-1) + 1
            ids, mask = ids[last:], mask[last:]
        kept = []
        for token, graded in zip(ids, mask, strict=True):
            if token == self.eos_token_id:
                break
            if graded:
                kept.append(token)
        return self.decoder.decode(kept)

    def trajectory(self, record: Mapping[str, Any], row: Mapping[str, Any]) -> Trajectory:
        """``record`` (a trajectory's ``TRAJECTORY_FIELDS``, with the optional ones it has) and
        ``row`` (its prompt's record: the dataset row) as a ``Trajectory``."""
        ids = list(record["response_ids"])
        mask = list(record.get("response_mask") or [1] * len(ids))
        multi_turn = "agent_turns" in record
        graded = [t for t, m in zip(ids, mask, strict=True) if m and t != self.eos_token_id]
        answer = self.response_text(record)
        return Trajectory(
            prompt=str(row.get("prompt", "")),
            response=answer,
            graded_text=self.decoder.decode(graded) if multi_turn else answer,
            transcript=self.decoder.decode(ids) if multi_turn else answer,
            data_source=str(record["data_source"]),
            ground_truth=str(record["ground_truth"]),
            extra=freeze({k: v for k, v in row.items() if k not in ROW_FIELDS}),
            tool_calls=tuple(
                ToolCall(str(name), bool(error), float(seconds)) for name, error, seconds in record.get("tool_calls") or []
            ),
            turns=int(record.get("agent_turns", 1)),
            stop_reason=str(record.get("stop_reason", "")),
            messages=self.messages(ids, mask) if multi_turn else (Message("assistant", answer),),
        )

    def messages(self, ids: list[int], mask: list[int]) -> tuple[Message, ...]:
        """A multi-turn response as chat messages: each run of graded tokens a model turn (up
        to its end of sequence), each run of observed tokens a tool (or user) message."""
        found: list[Message] = []
        at = 0
        for graded, run in groupby(mask):
            width = len(list(run))
            part, at = ids[at : at + width], at + width
            if graded:
                end = part.index(self.eos_token_id) if self.eos_token_id in part else len(part)
                found.append(Message("assistant", self.decoder.decode(part[:end])))
            else:
                found.append(observation_message(self.decoder.decode(part)))
        return tuple(found)
