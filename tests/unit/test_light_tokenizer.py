"""The tokenizers-only tokenizer (engines/model/light_tokenizer.py) against transformers' fast
tokenizer over the same tokenizer.json: the same ids, text, special ids and length, files that
transformers loads back, and transformers wherever the two could differ.

(The reference is ``PreTrainedTokenizerFast``: ``AutoTokenizer`` in transformers 5 swaps in
Qwen2's own tokenizer class for any model whose config says qwen2, which drops the built-in
tokenizer's spaces and newlines; see ``test_it_keeps_what_the_tokenizer_was_built_to_keep``.)"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from import_probe import imported_after

from rl_train.engines.model.light_tokenizer import LightTokenizer, load_light_tokenizer
from rl_train.engines.model.tokenizer import ALPHABET, build_char_tokenizer, load_tokenizer


def load_transformers_tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


def test_it_encodes_and_decodes_as_transformers_does(tiny_model_dir: Path) -> None:
    light, reference = load_light_tokenizer(tiny_model_dir), load_transformers_tokenizer(tiny_model_dir)
    assert isinstance(light, LightTokenizer)
    for role in ("bos", "eos", "pad", "unk"):
        assert getattr(light, f"{role}_token_id") == getattr(reference, f"{role}_token_id"), role
    assert len(light) == len(reference)
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(ALPHABET + "é€<s></s>") for _ in range(rng.randrange(0, 20)))
        for special in (False, True):
            assert light.encode(text, add_special_tokens=special) == reference.encode(text, add_special_tokens=special)
        ids = [rng.randrange(len(reference)) for _ in range(rng.randrange(0, 12))]
        for skip in (False, True):
            assert light.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


def test_saved_files_load_back_in_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    light = load_light_tokenizer(tiny_model_dir)
    assert light is not None
    light.save_pretrained(tmp_path / "tok")
    again = load_transformers_tokenizer(tmp_path / "tok")
    assert again.encode("12+7=19", add_special_tokens=False) == light.encode("12+7=19", add_special_tokens=False)
    assert again.eos_token_id == light.eos_token_id


def test_where_they_could_differ_transformers_tokenizes(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    assert load_light_tokenizer(folder) is None
    assert not isinstance(load_tokenizer(folder), LightTokenizer)


def test_loading_it_imports_no_transformers(tiny_model_dir: Path) -> None:
    statement = f"from rl_train.engines.model.tokenizer import load_tokenizer; load_tokenizer({str(tiny_model_dir)!r})"
    assert imported_after(statement, ("transformers", "torch")) == []


def test_an_unknown_character_encodes_as_transformers_does(tiny_model_dir: Path) -> None:
    light, reference = load_light_tokenizer(tiny_model_dir), load_transformers_tokenizer(tiny_model_dir)
    assert light is not None
    text = "2\u00a0+\u00a03 = ?"
    assert light.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", ["", "<s>1+1=2</s>", "<pad><unk>"])
def test_special_token_text_encodes_as_transformers_does(tiny_model_dir: Path, text: str) -> None:
    light, reference = load_light_tokenizer(tiny_model_dir), load_transformers_tokenizer(tiny_model_dir)
    assert light is not None
    assert light.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)


def test_it_keeps_what_the_tokenizer_was_built_to_keep(tiny_model_dir: Path) -> None:
    """Spaces and newlines are tokens of the built-in tokenizer: the loaded one keeps them."""
    light, built = load_light_tokenizer(tiny_model_dir), build_char_tokenizer()
    assert light is not None
    text = 'call {"a": 12, "b": 30}\n= 42'
    assert light.encode(text, add_special_tokens=False) == built.encode(text, add_special_tokens=False)
    assert light.decode(light.encode(text, add_special_tokens=False)) == text
