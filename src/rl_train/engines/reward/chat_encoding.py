"""A trajectory as a reward model's input ids, through the reward model's own tokenizer (R-6.3).

The policy's ids mean nothing to a reward model with another vocabulary, so the trajectory's
text (decoded with the policy's tokenizer by ``TrajectoryReader``) is put in the reward model's
chat template (the prompt as the user's message, each model turn an assistant message, each
tool answer a tool message: ``Trajectory.chat``) and encoded again with the reward model's
tokenizer. Two traps are kept out:

- **A double BOS.** A template that writes the BOS itself is encoded with
  ``add_special_tokens=False``; one that does not lets the tokenizer add its own.
- **Cutting the answer.** A trajectory longer than ``max_length`` loses tokens from the left
  of its prompt (the template's opening, the BOS included, is kept), and only when even that is
  not enough from the left of the response: the model always reads the end of the response,
  where the answer is. The prompt is found by rendering the template once with a sentinel in
  its place, and its tokens by the fast tokenizer's character offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rl_train.engines.reward.base import Trajectory

SENTINEL = "\u2063rl-train-prompt\u2063"
"""Stands for the prompt when the template is rendered to find where the prompt begins."""


class EncodingError(ValueError):
    """A trajectory the reward model cannot read (its template fails on it, or the template's
    opening alone is past ``max_length``)."""


@dataclass(frozen=True)
class Encoded:
    text: str
    """What the reward model reads, as text (before any truncation)."""
    ids: list[int]
    """Its ids, cut to ``max_length``."""


class ChatEncoder:
    """Encodes trajectories for one reward model (its tokenizer, template and length limit)."""

    def __init__(
        self, tokenizer: Any, max_length: int, chat_template: str | None = None, where: str = "reward model"
    ) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{where}: its tokenizer is not a fast one (tokenizer.json); truncation needs its offsets"
            )
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError(f"{where}: its tokenizer has no chat template; set {where}.chat_template")
        self.tokenizer = tokenizer
        self.max_length = max_length

    def render(self, trajectory: Trajectory) -> str:
        """The trajectory in the reward model's chat template, as text."""
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    trajectory.chat(), chat_template=self.template, tokenize=False
                )
            )
        except Exception as error:  # noqa: BLE001 - a template's own error (jinja's), for this trajectory
            raise EncodingError(
                f"the chat template fails on this trajectory: {type(error).__name__}: {error}"
            ) from None

    def prompt_start(self, trajectory: Trajectory, text: str) -> int:
        """Where the prompt begins in ``text``: after the template's opening, as a render with a
        sentinel for the prompt shows (the first occurrence of the prompt where that fails)."""
        probe = self.render(replace(trajectory, prompt=SENTINEL))
        opening = probe[: probe.find(SENTINEL)] if SENTINEL in probe else None
        if opening is not None and text.startswith(opening):
            return len(opening)
        found = text.find(trajectory.prompt)
        return max(found, 0)

    def encode(self, trajectory: Trajectory) -> Encoded:
        text = self.render(trajectory)
        bos = getattr(self.tokenizer, "bos_token", None)
        add_special = not (bos and text.startswith(bos))  # the template wrote it: never twice
        encoding = self.tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
        ids = list(encoding["input_ids"])
        excess = len(ids) - self.max_length
        if excess <= 0:
            return Encoded(text, ids)
        start = self.prompt_start(trajectory, text)
        offsets = encoding["offset_mapping"]
        first = next((i for i, (a, b) in enumerate(offsets) if b > a and a >= start), len(ids))
        if first + excess > len(ids):
            raise EncodingError(
                f"the chat template's opening alone is {first} tokens, past max_length {self.max_length}"
            )
        return Encoded(text, ids[:first] + ids[first + excess :])
