"""The HF bridge in-process: conversion round trips bit for bit, tensor-parallel shards put
back together give the whole, unsupported architectures are refused, and the names the CPU
layer patches still exist in megatron-core. (megatron's GPTModel itself against HF, in
processes of their own: ``test_megatron_cpu.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import pytest
import torch
from safetensors.torch import load_file

from rl_train.engines.training.megatron.hf_bridge import (
    UnsupportedModelError,
    check_supported,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    split_qkv,
)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize(("heads", "groups", "dim"), [(4, 2, 16), (8, 8, 4), (6, 1, 8)])
def test_qkv_fuses_by_query_group_and_splits_back(heads: int, groups: int, dim: int) -> None:
    config = {"num_attention_heads": heads, "num_key_value_heads": groups, "hidden_size": heads * dim}
    q = torch.randn(heads * dim, 5)
    k, v = torch.randn(groups * dim, 5), torch.randn(groups * dim, 5)
    fused = fuse_qkv(q, k, v, config)
    per_group = heads // groups
    first = fused[: (per_group + 2) * dim]  # group 0: its query heads, then its key, then its value
    assert first[: per_group * dim].equal(q[: per_group * dim])
    assert first[per_group * dim : (per_group + 1) * dim].equal(k[:dim])
    assert first[(per_group + 1) * dim :].equal(v[:dim])
    assert all(a.equal(b) for a, b in zip(split_qkv(fused, config), (q, k, v), strict=True))


def test_the_policy_round_trips_hf_to_megatron_and_back_bit_for_bit(tiny_model_dir: Path) -> None:
    hf = load_file(str(tiny_model_dir / "model.safetensors"))
    config = _config(tiny_model_dir)
    back = megatron_to_hf(hf_to_megatron(hf, config), config)
    assert back.keys() == hf.keys()
    assert all(back[k].dtype == hf[k].dtype and back[k].equal(hf[k]) for k in hf)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type 'yarn'"),
    ],
)
def test_an_architecture_the_bridge_cannot_convert_is_refused_by_name(
    tiny_model_dir: Path, change: dict, message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        check_supported({**_config(tiny_model_dir), **change})


def test_the_cpu_layer_patches_what_megatron_still_has() -> None:
    """The names the layer replaces; a release that renames one makes the layer a no-op."""
    import megatron.core.tensor_parallel.random as megatron_random
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    assert callable(megatron_random._get_cuda_rng_state) and callable(megatron_random._set_cuda_rng_state)
    assert "torch.cuda.current_device()" in Path(rotary_pos_embedding.__file__).read_text()


def test_tensor_parallel_shards_put_back_together_give_the_whole(tiny_model_dir: Path) -> None:
    from rl_train.engines.training.megatron.hf_bridge import padded_vocab_size, shard_for_tensor_parallel

    config = _config(tiny_model_dir)
    whole = hf_to_megatron(load_file(str(tiny_model_dir / "model.safetensors")), config)
    shards = [shard_for_tensor_parallel(whole, config, 2, rank) for rank in range(2)]
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert torch.cat([s[qkv] for s in shards]).equal(whole[qkv])
    proj = "decoder.layers.0.self_attention.linear_proj.weight"
    assert torch.cat([s[proj] for s in shards], dim=1).equal(whole[proj])
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    halves = [torch.chunk(s[fc1], 2) for s in shards]  # each rank: its gate rows, then its up rows
    gate, up = torch.chunk(whole[fc1], 2)
    assert torch.cat([h[0] for h in halves]).equal(gate) and torch.cat([h[1] for h in halves]).equal(up)
    embedding = torch.cat([s["embedding.word_embeddings.weight"] for s in shards])
    assert embedding.shape[0] == padded_vocab_size(config, 2) == 92
    assert embedding[:91].equal(whole["embedding.word_embeddings.weight"]) and not embedding[91:].any()
    with pytest.raises(UnsupportedModelError, match="num_key_value_heads 2 is not divisible"):
        shard_for_tensor_parallel(whole, config, 4, 0)


def test_pipeline_stages_split_the_layers_and_place_the_ends(tiny_model_dir: Path) -> None:
    from rl_train.engines.training.megatron.hf_bridge import shard_for_pipeline

    config = _config(tiny_model_dir)
    whole = hf_to_megatron(load_file(str(tiny_model_dir / "model.safetensors")), config)
    first, last = (shard_for_pipeline(whole, config, 2, rank) for rank in range(2))
    name = "decoder.layers.1.mlp.linear_fc2.weight"
    assert first[name].equal(whole[name]) and last[name].equal(whole["decoder.layers.3.mlp.linear_fc2.weight"])
    assert "embedding.word_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert "embedding.word_embeddings.weight" not in last and "decoder.final_layernorm.weight" in last
    assert last["output_layer.weight"].equal(whole["embedding.word_embeddings.weight"])  # tied: a copy
    assert not any(".layers.2." in n or ".layers.3." in n for n in (*first, *last))
    with pytest.raises(UnsupportedModelError, match="num_hidden_layers 4 is not divisible"):
        shard_for_pipeline(whole, config, 3, 0)


@pytest.mark.parametrize("size", [1, 2])
def test_tensor_parallel_shards_unshard_to_the_whole_bit_for_bit(tiny_model_dir: Path, size: int) -> None:
    from rl_train.engines.training.megatron.hf_bridge import (
        shard_for_tensor_parallel,
        unshard_tensor_parallel,
    )

    config = _config(tiny_model_dir)
    whole = hf_to_megatron(load_file(str(tiny_model_dir / "model.safetensors")), config)
    back = unshard_tensor_parallel([shard_for_tensor_parallel(whole, config, size, r) for r in range(size)], config)
    assert back.keys() == whole.keys() and all(back[k].equal(whole[k]) for k in whole)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_pipeline_stages_merge_to_the_whole_bit_for_bit(tiny_model_dir: Path, size: int) -> None:
    from rl_train.engines.training.megatron.hf_bridge import merge_pipeline_stages, shard_for_pipeline

    config = _config(tiny_model_dir)
    whole = hf_to_megatron(load_file(str(tiny_model_dir / "model.safetensors")), config)
    back = merge_pipeline_stages([shard_for_pipeline(whole, config, size, r) for r in range(size)], config)
    assert back.keys() == whole.keys() and all(back[k].equal(whole[k]) for k in whole)
