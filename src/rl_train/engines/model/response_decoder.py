"""Response ids to text for the reward workers, without importing transformers when it can.

A reward worker only decodes: it needs the model's end-of-sequence id and ``decode(ids,
skip_special_tokens=True)``. Where the model's tokenizer is exactly its ``tokenizers`` backend
(``engines/model/light_tokenizer.py`` says when), that decodes, without transformers;
otherwise transformers does, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rl_train.engines.model.light_tokenizer import load_light_tokenizer


class ResponseDecoder(Protocol):
    eos_token_id: int | None

    def decode(self, ids: list[int]) -> str:
        """``ids`` as text, special tokens left out."""
        ...


class TokenizersDecoder:
    """Decodes with the ``tokenizers`` library alone (see the module docstring for when)."""

    def __init__(self, backend: Any, eos_token_id: int | None) -> None:
        self.backend = backend
        self.eos_token_id = eos_token_id

    def decode(self, ids: list[int]) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=True))


class TransformersDecoder:
    """Decodes with the model's transformers tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def light_decoder(path: str | Path) -> TokenizersDecoder | None:
    """The ``tokenizers``-only decoder of the model at ``path``, or None where it could differ
    from transformers' decode."""
    tokenizer = load_light_tokenizer(path)
    return None if tokenizer is None else TokenizersDecoder(tokenizer.backend, tokenizer.eos_token_id)


def load_response_decoder(path: str | Path) -> ResponseDecoder:
    """The decoder a reward worker uses for the model at ``path`` (a local HF directory)."""
    light = light_decoder(path)
    if light is not None:
        return light
    from rl_train.engines.model.tokenizer import load_tokenizer

    return TransformersDecoder(load_tokenizer(path))
