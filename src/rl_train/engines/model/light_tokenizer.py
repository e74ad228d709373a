"""A model's tokenizer on the ``tokenizers`` library alone, where that is exactly transformers'.

The engines use a small part of a tokenizer: ``encode(text, add_special_tokens=...)``,
``decode(ids, skip_special_tokens=...)``, the bos / eos / pad / unk ids, ``len`` and
``save_pretrained``. For a fast tokenizer (a ``tokenizer.json``) transformers does each of these
by calling ``tokenizers``, except that it may clean up spaces after decoding
(``clean_up_tokenization_spaces``) and that it marks the tokens ``tokenizer_config.json``
names as special. ``light_backend`` therefore accepts a directory only when its config asks
for no clean-up and every token it names is already special in ``tokenizer.json`` (as in
files transformers saved); otherwise the model's tokenizer loads through transformers, as
before. Importing transformers costs a process about a second of CPU at start-up, when every
worker of a run starts at once on the same cores.

It is also the faithful reading of ``tokenizer.json``: transformers 5's ``AutoTokenizer``
replaces the tokenizer of any model whose ``config.json`` says ``qwen2`` by Qwen2's own class,
which re-derives the pre-tokenizer and drops what its byte-level vocabulary lacks; for the
built-in character tokenizer that is every space and newline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""What ``save_pretrained`` copies: the files that make the tokenizer, as they were."""


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


def light_backend(path: str | Path) -> tuple[Any, dict[str, Any]] | None:
    """The ``tokenizers`` tokenizer of the model at ``path`` and its tokenizer config, or None
    where using it alone could differ from transformers (see the module docstring)."""
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
    return backend, config


class LightTokenizer:
    """The part of transformers' fast tokenizer the engines use (see the module docstring)."""

    def __init__(self, folder: str | Path, backend: Any, config: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.backend = backend
        for role in ("bos", "eos", "pad", "unk"):
            token = _content(config.get(f"{role}_token"))
            setattr(self, f"{role}_token", token)
            setattr(self, f"{role}_token_id", backend.token_to_id(token) if token is not None else None)

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def save_pretrained(self, path: str | Path) -> None:
        """The tokenizer's files, copied as they are, into ``path``."""
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, target / name)


def load_light_tokenizer(path: str | Path) -> LightTokenizer | None:
    found = light_backend(path)
    return None if found is None else LightTokenizer(path, *found)
