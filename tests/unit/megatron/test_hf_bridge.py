"""megatron-core behind the HF bridge and the CPU layer: conversion round trips bit for bit,
and the real megatron GPTModel built from the built-in policy gives HF's logits on CPU.

These fail if a megatron-core release moves what the CPU layer patches or changes the
layouts the bridge writes (fused QKV by query group, [gate; up])."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("megatron.core")

from rl_train.engines.training.megatron.hf_bridge import (  # noqa: E402
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


FORWARD = """
import json, os, socket, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.hf_bridge import build_gpt_model, hf_to_megatron, transformer_config

folder = sys.argv[1]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from megatron.core import parallel_state, tensor_parallel
parallel_state.initialize_model_parallel(1, 1)
hf_config = json.load(open(f"{folder}/config.json"))
with megatron_on_this_device():
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = build_gpt_model(hf_config, transformer_config(hf_config))
missing, unexpected = model.load_state_dict(hf_to_megatron(load_file(f"{folder}/model.safetensors"), hf_config), strict=False)
assert not unexpected and all("_extra_state" in k for k in missing), (missing, unexpected)
ids = torch.randint(0, hf_config["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(0))
positions = torch.arange(9).unsqueeze(0).expand(3, -1)
model.eval()
with torch.no_grad(), megatron_on_this_device():
    got = model(ids, positions, attention_mask=None)
with torch.no_grad():
    want = AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits
print(json.dumps({"shape": list(got.shape), "max_abs_diff": (got - want).abs().max().item()}))
dist.destroy_process_group()
"""


def test_megatron_gpt_model_gives_the_hf_logits_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "forward.py"
    script.write_text(textwrap.dedent(FORWARD))
    run = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["shape"] == [3, 9, _config(tiny_model_dir)["vocab_size"]]
    assert result["max_abs_diff"] < 1e-5, result


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


TP_FORWARD = """
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from safetensors.torch import load_file
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.hf_bridge import (
    build_gpt_model, hf_to_megatron, shard_for_tensor_parallel, transformer_config,
)

folder, port, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
from megatron.core import parallel_state, tensor_parallel
parallel_state.initialize_model_parallel(tensor_model_parallel_size=size)
hf_config = json.load(open(f"{folder}/config.json"))
with megatron_on_this_device():
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = build_gpt_model(hf_config, transformer_config(hf_config, tensor_model_parallel_size=size))
whole = hf_to_megatron(load_file(f"{folder}/model.safetensors"), hf_config)
missing, unexpected = model.load_state_dict(shard_for_tensor_parallel(whole, hf_config, size, rank), strict=False)
assert not unexpected and all("_extra_state" in k for k in missing), (missing, unexpected)
ids = torch.randint(0, hf_config["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(0))
positions = torch.arange(9).unsqueeze(0).expand(3, -1)
model.eval()
with torch.no_grad(), megatron_on_this_device():
    got = model(ids, positions, attention_mask=None)[..., : hf_config["vocab_size"]]
if rank == 0:
    from transformers import AutoModelForCausalLM
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits
    print(json.dumps({"max_abs_diff": (got - want).abs().max().item()}))
dist.destroy_process_group()
"""


def test_two_tensor_parallel_ranks_give_the_hf_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    import socket

    script = tmp_path / "tp_forward.py"
    script.write_text(textwrap.dedent(TP_FORWARD))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(tiny_model_dir), port, str(rank), "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=300) for rank in ranks]
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-4000:]
    result = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert result["max_abs_diff"] < 1e-5, result
