"""A TransferQueue trajectory record (and its prompt's row) as the ``Trajectory`` a reward reads.

Only the graded tokens (response_mask == 1) are the model's (R-6.2). A multi-turn trajectory
(``agent_turns``) ends each turn with end of sequence, so its answer is its last turn: what
the model wrote after the last tool observation; ``graded_text`` is all its turns, and
``transcript`` the whole response with the tools' answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_train.engines.model.response_decoder import ResponseDecoder
from rl_train.engines.reward.base import ROW_FIELDS, ToolCall, Trajectory, freeze

TRAJECTORY_FIELDS = ["response_ids", "group_id", "data_source", "ground_truth"]
"""What the reward worker reads of every trajectory record (never log-probs or versions)."""
OPTIONAL_TRAJECTORY_FIELDS = ["response_mask", "agent_turns", "tool_calls", "stop_reason"]
"""What a multi-turn trajectory adds, and how generation ended."""


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
        )
