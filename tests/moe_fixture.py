"""A tiny mixture-of-experts policy for tests: an HF Mixtral of 2 layers, 4 experts, top 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

EXPERTS, TOP_K, LAYERS = 4, 2, 2


@pytest.fixture(scope="session")
def tiny_moe_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Mixtral (HF layout, random weights) with the built-in policy's tokenizer."""
    from transformers import MixtralConfig, MixtralForCausalLM

    folder = tmp_path_factory.mktemp("mixtral")
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=91, hidden_size=64, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    MixtralForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, folder / name)
    return folder
