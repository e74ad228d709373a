"""The policy's HF checkpoint as a megatron-core ``GPTModel``, and back.

Supported: decoder-only models with RMSNorm, a SwiGLU MLP, rotary embeddings and grouped-query
attention (HF ``qwen2`` and ``llama``; Qwen2 adds a bias to q, k and v). Anything else is
refused by name, with what is supported.

Layouts (megatron-core's local layer spec, no Transformer Engine):

- **QKV.** megatron fuses q, k and v in one ``linear_qkv`` whose rows go by query group: for
  each of the ``num_key_value_heads`` groups, that group's query heads, then its key head,
  then its value head. HF keeps three projections. The bias follows the weight.
- **MLP.** ``linear_fc1`` is ``[gate; up]`` (megatron's gated linear unit applies the
  activation to the first half), ``linear_fc2`` is ``down``.
- **Norms and embeddings** map one to one; with tied embeddings there is no output layer.

The conversion works on whole tensors; ``shard_for_tensor_parallel`` then cuts them for one
tensor-parallel rank, as megatron's parallel layers hold them:

- column-parallel layers split their output rows: ``linear_qkv`` by whole query groups (the
  fused layout keeps each group's rows together), ``linear_fc1`` gate and up halves each;
- row-parallel layers (``linear_proj``, ``linear_fc2``) split their input columns;
- the embedding (and an untied output layer) split the vocabulary, padded with zero rows to
  a multiple of the TP size (``padded_vocab_size``); norms are whole on every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_train.engines.training.megatron.moe_bridge import (
    define_missing_te_gemm,
    is_moe,
    moe_config_fields,
    moe_to_hf,
    moe_to_megatron,
)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mixtral")
QKV_BIAS = {"qwen2": True}
"""Model types whose q, k and v projections carry a bias by design (llama: ``attention_bias``)."""


class UnsupportedModelError(ValueError):
    """The HF model's architecture is not one this bridge converts."""


def _get(hf_config: Any, key: str, default: Any = None) -> Any:
    if isinstance(hf_config, dict):
        return hf_config.get(key, default)
    return getattr(hf_config, key, default)


def rope_theta(hf_config: Any) -> float:
    """The rotary base: ``rope_parameters.rope_theta`` (transformers 5) or ``rope_theta``."""
    parameters = _get(hf_config, "rope_parameters") or {}
    if isinstance(parameters, dict) and parameters.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"rope_type {parameters['rope_type']!r} (supported: default)")
    theta = parameters.get("rope_theta") if isinstance(parameters, dict) else None
    return float(theta if theta is not None else _get(hf_config, "rope_theta", 10000.0))


def check_supported(hf_config: Any) -> str:
    """The model type, or ``UnsupportedModelError`` naming what is not supported."""
    model_type = _get(hf_config, "model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by the megatron engine (supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if _get(hf_config, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {_get(hf_config, 'hidden_act')!r} (supported: silu)")
    if _get(hf_config, "use_sliding_window", False) or (model_type == "mixtral" and _get(hf_config, "sliding_window")):
        raise UnsupportedModelError("sliding-window attention is not supported")
    rope_theta(hf_config)
    return str(model_type)


def head_dim(hf_config: Any) -> int:
    explicit = _get(hf_config, "head_dim")
    return int(explicit or _get(hf_config, "hidden_size") // _get(hf_config, "num_attention_heads"))


def qkv_bias(hf_config: Any) -> bool:
    return bool(QKV_BIAS.get(_get(hf_config, "model_type"), _get(hf_config, "attention_bias", False)))


def transformer_config(hf_config: Any, params_dtype: torch.dtype = torch.float32, **parallel: Any) -> Any:
    """megatron-core's ``TransformerConfig`` for the HF model; ``parallel`` sets the parallel
    sizes (``tensor_model_parallel_size``, ``pipeline_model_parallel_size``...). Fusions are
    off: they need CUDA kernels, and the engine turns on what the device supports. With
    pipeline stages, activations travel in ``params_dtype``; without CUDA (gloo) each
    send and receive is its own call, since gloo cannot batch them."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_supported(hf_config)
    if parallel.get("pipeline_model_parallel_size", 1) > 1:
        parallel.setdefault("pipeline_dtype", params_dtype)
        parallel.setdefault("batch_p2p_comm", torch.cuda.is_available())
    return TransformerConfig(
        num_layers=int(_get(hf_config, "num_hidden_layers")),
        hidden_size=int(_get(hf_config, "hidden_size")),
        ffn_hidden_size=int(_get(hf_config, "intermediate_size")),
        num_attention_heads=int(_get(hf_config, "num_attention_heads")),
        num_query_groups=int(_get(hf_config, "num_key_value_heads") or _get(hf_config, "num_attention_heads")),
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=float(_get(hf_config, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias(hf_config),
        hidden_dropout=0.0,
        attention_dropout=float(_get(hf_config, "attention_dropout", 0.0) or 0.0),
        params_dtype=params_dtype,
        use_cpu_initialization=not torch.cuda.is_available(),
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        **moe_config_fields(hf_config),
        **parallel,
    )


def padded_vocab_size(hf_config: Any, tensor_parallel_size: int = 1) -> int:
    """The vocabulary rounded up to a multiple of the TP size (each rank holds an equal slice)."""
    vocab = int(_get(hf_config, "vocab_size"))
    return -(-vocab // tensor_parallel_size) * tensor_parallel_size


def build_gpt_model(
    hf_config: Any,
    config: Any,
    pre_process: bool = True,
    post_process: bool = True,
    parallel_output: bool = False,
) -> Any:
    """An untrained ``GPTModel`` of the HF model's shape (megatron-core's local layer spec),
    its vocabulary padded for the config's TP size. ``parallel_output`` off: every TP rank
    gets the whole logits (the padded columns included)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    experts = config.num_moe_experts
    if experts:
        define_missing_te_gemm()
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(
            num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm"
        ),
        vocab_size=padded_vocab_size(hf_config, config.tensor_model_parallel_size),
        max_sequence_length=int(_get(hf_config, "max_position_embeddings")),
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=bool(_get(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
    )


def _groups(hf_config: Any) -> tuple[int, int, int]:
    """(query groups, query heads per group, head dim)."""
    heads = int(_get(hf_config, "num_attention_heads"))
    groups = int(_get(hf_config, "num_key_value_heads") or heads)
    return groups, heads // groups, head_dim(hf_config)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf_config: Any) -> torch.Tensor:
    """HF's q, k, v projections (weights or biases) as megatron's ``linear_qkv`` rows."""
    groups, per_group, dim = _groups(hf_config)
    rest = q.shape[1:]
    parts = (q.reshape(groups, per_group * dim, *rest), k.reshape(groups, dim, *rest), v.reshape(groups, dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, hf_config: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """megatron's ``linear_qkv`` rows as HF's q, k, v (the inverse of ``fuse_qkv``)."""
    groups, per_group, dim = _groups(hf_config)
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * dim, *rest)
    q, k, v = torch.split(grouped, [per_group * dim, dim, dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


ONE_TO_ONE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
"""Per-layer HF names (under ``model.layers.N.``) -> megatron names (under ``decoder.layers.N.``)."""


def _pairs(hf_config: Any) -> list[tuple[str, str]]:
    """(HF name, megatron name) of every tensor that maps one to one."""
    pairs = [
        ("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        ("model.norm.weight", "decoder.final_layernorm.weight"),
    ]
    if not _get(hf_config, "tie_word_embeddings", False):
        pairs.append(("lm_head.weight", "output_layer.weight"))
    per_layer = {h: m for h, m in ONE_TO_ONE.items() if not (is_moe(hf_config) and h.startswith("mlp."))}
    for i in range(int(_get(hf_config, "num_hidden_layers"))):
        pairs += [(f"model.layers.{i}.{h}", f"decoder.layers.{i}.{m}") for h, m in per_layer.items()]
    return pairs


def _qkv_names(hf_config: Any, layer: int) -> list[tuple[list[str], str]]:
    """([HF q, k, v names], megatron fused name) of a layer's weight (and bias)."""
    attn, fused = f"model.layers.{layer}.self_attn.", f"decoder.layers.{layer}.self_attention.linear_qkv."
    kinds = ("weight", "bias") if qkv_bias(hf_config) else ("weight",)
    return [([f"{attn}{p}_proj.{kind}" for p in "qkv"], fused + kind) for kind in kinds]


def _mlp_names(layer: int) -> tuple[list[str], str]:
    """([HF gate, up names], megatron ``linear_fc1`` name) of a layer."""
    halves = [f"model.layers.{layer}.mlp.{p}_proj.weight" for p in ("gate", "up")]
    return halves, f"decoder.layers.{layer}.mlp.linear_fc1.weight"


def hf_to_megatron(hf_state: dict[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """The HF state dict (``model.…`` names) as ``GPTModel`` parameters, whole (no TP shards)."""
    check_supported(hf_config)
    out = {m: hf_state[h] for h, m in _pairs(hf_config)}
    for layer in range(int(_get(hf_config, "num_hidden_layers"))):
        for (q, k, v), fused in _qkv_names(hf_config, layer):
            out[fused] = fuse_qkv(hf_state[q], hf_state[k], hf_state[v], hf_config)
        if is_moe(hf_config):
            out.update(moe_to_megatron(hf_state, hf_config, layer))
            continue
        halves, fc1 = _mlp_names(layer)
        out[fc1] = torch.cat([hf_state[name] for name in halves])
    return out


def megatron_to_hf(state: dict[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """``GPTModel`` parameters (whole) as the HF state dict: the inverse of ``hf_to_megatron``."""
    check_supported(hf_config)
    out = {h: state[m] for h, m in _pairs(hf_config)}
    for layer in range(int(_get(hf_config, "num_hidden_layers"))):
        for names, fused in _qkv_names(hf_config, layer):
            out.update(zip(names, split_qkv(state[fused], hf_config), strict=True))
        if is_moe(hf_config):
            out.update(moe_to_hf(state, hf_config, layer))
            continue
        halves, fc1 = _mlp_names(layer)
        out.update(zip(halves, torch.chunk(state[fc1], 2, dim=0), strict=True))
    return out

COLUMN_PARALLEL = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
VOCAB_PARALLEL = ("embedding.word_embeddings.weight", "output_layer.weight")


def shard_for_tensor_parallel(
    state: dict[str, torch.Tensor], hf_config: Any, size: int, rank: int
) -> dict[str, torch.Tensor]:
    """Whole ``GPTModel`` parameters (``hf_to_megatron``) as TP rank ``rank`` of ``size`` holds them."""
    groups = _groups(hf_config)[0]
    if groups % size:
        raise UnsupportedModelError(
            f"num_key_value_heads {groups} is not divisible by tensor_model_parallel_size {size}"
        )
    out = {}
    for name, tensor in state.items():
        if name.endswith(COLUMN_PARALLEL):
            out[name] = torch.chunk(tensor, size, dim=0)[rank]  # whole query groups per rank
        elif name.endswith("mlp.linear_fc1.weight"):
            gate, up = torch.chunk(tensor, 2, dim=0)
            out[name] = torch.cat([torch.chunk(gate, size, dim=0)[rank], torch.chunk(up, size, dim=0)[rank]])
        elif name.endswith(ROW_PARALLEL):
            out[name] = torch.chunk(tensor, size, dim=1)[rank]
        elif name in VOCAB_PARALLEL:
            padded = padded_vocab_size(hf_config, size)
            full = torch.nn.functional.pad(tensor, (0, 0, 0, padded - tensor.shape[0]))
            out[name] = torch.chunk(full, size, dim=0)[rank]
        else:
            out[name] = tensor
    return {name: tensor.contiguous() for name, tensor in out.items()}


def shard_for_pipeline(state: dict[str, torch.Tensor], hf_config: Any, size: int, rank: int) -> dict[str, torch.Tensor]:
    """The parameters pipeline stage ``rank`` of ``size`` holds: an even share of the layers,
    numbered from 0 on each stage, the embedding on the first stage, the final norm and the
    output layer on the last (with tied embeddings, a copy of the embedding, which megatron
    keeps in step by summing the two stages' gradients)."""
    layers = int(_get(hf_config, "num_hidden_layers"))
    if layers % size:
        raise UnsupportedModelError(
            f"num_hidden_layers {layers} is not divisible by pipeline_model_parallel_size {size}"
        )
    per_stage = layers // size
    first, last = rank == 0, rank == size - 1
    out = {}
    for name, tensor in state.items():
        if name.startswith("decoder.layers."):
            index = int(name.split(".")[2])
            if index // per_stage == rank:
                out[name.replace(f"decoder.layers.{index}.", f"decoder.layers.{index - rank * per_stage}.", 1)] = tensor
        elif (name.startswith("embedding.") and first) or (
            name.startswith(("decoder.final_layernorm", "output_layer.")) and last
        ):
            out[name] = tensor
    if last and not first and "output_layer.weight" not in out:
        out["output_layer.weight"] = state["embedding.word_embeddings.weight"]
    return out


def unshard_tensor_parallel(shards: list[dict[str, torch.Tensor]], hf_config: Any) -> dict[str, torch.Tensor]:
    """The whole parameters from every TP rank's shard (rank order): ``shard_for_tensor_parallel``
    undone, the vocabulary's padding rows dropped."""
    vocab = int(_get(hf_config, "vocab_size"))
    out = {}
    for name, first in shards[0].items():
        parts = [shard[name] for shard in shards]
        if name.endswith(COLUMN_PARALLEL):
            out[name] = torch.cat(parts)
        elif name.endswith("mlp.linear_fc1.weight"):
            halves = [torch.chunk(part, 2, dim=0) for part in parts]
            out[name] = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
        elif name.endswith(ROW_PARALLEL):
            out[name] = torch.cat(parts, dim=1)
        elif name in VOCAB_PARALLEL:
            out[name] = torch.cat(parts)[:vocab]
        else:
            out[name] = first
    return out


def merge_pipeline_stages(stages: list[dict[str, torch.Tensor]], hf_config: Any) -> dict[str, torch.Tensor]:
    """The whole parameters from every pipeline stage's (stage order): ``shard_for_pipeline``
    undone, layers numbered globally again; a tied model's output-layer copy is dropped."""
    per_stage = int(_get(hf_config, "num_hidden_layers")) // len(stages)
    tied = bool(_get(hf_config, "tie_word_embeddings", False))
    out = {}
    for rank, stage in enumerate(stages):
        for name, tensor in stage.items():
            if name.startswith("decoder.layers."):
                index = int(name.split(".")[2])
                name = name.replace(f"decoder.layers.{index}.", f"decoder.layers.{index + rank * per_stage}.", 1)
            elif name == "output_layer.weight" and tied:
                continue
            out[name] = tensor
    return out
