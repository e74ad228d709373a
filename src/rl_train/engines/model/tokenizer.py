"""A character-level tokenizer built with ``tokenizers`` and saved in HF format, and loading a
model's tokenizer.

Each character of ``ALPHABET`` is one token; anything else maps to ``<unk>``. A BPE model
with no merges is exactly a character tokenizer, and it round-trips through
``tokenizer.json`` / ``AutoTokenizer`` like any real one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_train.engines.model.light_tokenizer import load_light_tokenizer

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ALPHABET = "0123456789+-*/=()<>.,:;?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_'\"\n#[]{}"


def build_char_tokenizer() -> Any:
    """The built-in character tokenizer (special tokens first, then ``ALPHABET``), a
    transformers ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *ALPHABET))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )


def load_transformers_tokenizer(path: str | Path) -> Any:
    """The tokenizer of an HF-format directory through transformers' ``AutoTokenizer``, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of an HF-format directory, offline: on ``tokenizers`` alone where that is
    exactly transformers' (``light_tokenizer``), else through transformers."""
    return load_light_tokenizer(path) or load_transformers_tokenizer(path)
