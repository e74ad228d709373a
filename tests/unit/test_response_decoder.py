"""The reward workers' decoder: tokenizers alone where that equals transformers' decode,
transformers otherwise; and a reward worker that imports neither torch nor transformers."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from import_probe import imported_after

from rl_train.engines.model.response_decoder import (
    TokenizersDecoder,
    TransformersDecoder,
    light_decoder,
    load_response_decoder,
)
from rl_train.engines.model.tokenizer import load_transformers_tokenizer as load_tokenizer


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    return folder


def test_the_light_decoder_decodes_as_transformers_does(tiny_model_dir: Path) -> None:
    light, reference = load_response_decoder(tiny_model_dir), load_tokenizer(tiny_model_dir)
    assert isinstance(light, TokenizersDecoder)
    assert light.eos_token_id == reference.eos_token_id
    rng = random.Random(0)
    vocab = len(reference)
    for _ in range(300):  # special ids (pad, bos, eos, unk) among them
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
        assert light.decode(ids) == reference.decode(ids, skip_special_tokens=True), ids


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "change",
    [
        {"clean_up_tokenization_spaces": True},  # transformers would clean up spaces
        {"additional_special_tokens": ["+"]},  # special to transformers, not in tokenizer.json
        {"eos_token": 7},  # a form this module does not read
    ],
    ids=["cleanup", "unflagged-special", "odd-form"],
)
def test_transformers_decodes_where_tokenizers_alone_could_differ(model_copy: Path, change: dict) -> None:
    _edit_config(model_copy, **change)
    assert light_decoder(model_copy) is None
    if "eos_token" not in change:
        assert isinstance(load_response_decoder(model_copy), TransformersDecoder)


def test_without_tokenizer_json_transformers_decodes(model_copy: Path) -> None:
    (model_copy / "tokenizer.json").unlink()
    assert light_decoder(model_copy) is None


def test_the_reward_worker_imports_neither_torch_nor_transformers() -> None:
    statement = "import rl_train.engines.workers.reward_worker"
    assert imported_after(statement, ("torch", "transformers")) == []
