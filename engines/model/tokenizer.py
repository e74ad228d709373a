"""A character-level tokenizer built with ``tokenizers`` and saved in HF format.

Each character of ``ALPHABET`` is one token; anything else maps to ``<unk>``. A BPE model
with no merges is exactly a character tokenizer, and it round-trips through
``tokenizer.json`` / ``AutoTokenizer`` like any real one.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ALPHABET = "0123456789+-*/=()<>.,:;?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_'\"\n#[]{}"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in character tokenizer (special tokens first, then ``ALPHABET``)."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *ALPHABET))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer from an HF-format directory, offline."""
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
