"""Response ids to text for the reward workers, without importing transformers when it can.

A reward worker only decodes: it needs the model's end-of-sequence id and ``decode(ids,
skip_special_tokens=True)``. For a fast tokenizer (a ``tokenizer.json``) that is the
``tokenizers`` library's own decode, which is all transformers' fast tokenizer calls, except:

- it may clean up spaces afterwards (``clean_up_tokenization_spaces``), and
- it marks the special tokens that ``tokenizer_config.json`` names (``eos_token``,
  ``additional_special_tokens``, ``added_tokens_decoder``...) as special in the backend.

So ``tokenizers`` alone decodes when the config asks for no clean-up and every special token
it names is already special in ``tokenizer.json`` (as it is in files that transformers saved).
Otherwise, or without a ``tokenizer.json``, transformers decodes, as before. Importing
transformers and torch costs a process about two seconds of CPU at start-up, when every
worker of a run starts at once on the same cores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


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


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _named_special_tokens(config: dict[str, Any]) -> list[str] | None:
    """Every token the config names special; None when it names one in a form not known here."""
    named: list[Any] = [config[key] for key in NAMED_SPECIAL_TOKENS if config.get(key) is not None]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key) or []
        if isinstance(extra, dict):
            extra = list(extra.values())
        if not isinstance(extra, list):
            return None
        named += extra
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        return None
    named += [entry for entry in decoder.values() if isinstance(entry, dict) and entry.get("special")]
    contents = [_content(token) for token in named]
    return None if any(c is None for c in contents) else [c for c in contents if c is not None]


def light_decoder(path: str | Path) -> TokenizersDecoder | None:
    """The ``tokenizers``-only decoder of the model at ``path``, or None where it could differ
    from transformers' decode."""
    folder = Path(path)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    if not isinstance(config, dict) or config.get("clean_up_tokenization_spaces"):
        return None
    named = _named_special_tokens(config)
    if named is None:
        return None
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(tokenizer_file))
    special = {token.content for token in backend.get_added_tokens_decoder().values() if token.special}
    if not set(named) <= special:
        return None
    eos = _content(config.get("eos_token"))
    return TokenizersDecoder(backend, backend.token_to_id(eos) if eos is not None else None)


def load_response_decoder(path: str | Path) -> ResponseDecoder:
    """The decoder a reward worker uses for the model at ``path`` (a local HF directory)."""
    light = light_decoder(path)
    if light is not None:
        return light
    from rl_train.engines.model.tokenizer import load_tokenizer

    return TransformersDecoder(load_tokenizer(path))
