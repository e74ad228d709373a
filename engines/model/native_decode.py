"""One decode step of the native model (one new token per row) without going through its modules.

Why. At 256 rows of the demo's 64-wide policy a decode step is some 120 small kernels, and
the modules' calls around them (``nn.Module.__call__``, the [B, 1, ...] views and transposes
of a general forward, a separate kernel for each residual add) are a measurable share of it.
This is the same step written as straight calls on the same weights: the residual adds are
folded into the output projections' matmuls (``addmm``), and q, k and v stay [B, heads, D].
Every kernel that computes a value is the one the module forward runs on the same numbers,
in the same order, so the logits and the keys and values it writes to the cache are the
module forward's (``tests/unit/test_native_decode.py`` holds it to that).

It reads the stacked q/k/v and gate/up weights that ``fuse_projections`` makes (a rollout
engine's model); ``can_decode_fast`` says whether a model has them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rl_train.engines.model.native import (
    KVCache,
    NativeCausalLM,
    attention_mask_4d,
    decode_attention,
    decode_bias,
    rope_tables,
    swap_halves,
)


def can_decode_fast(model: nn.Module) -> bool:
    """Whether ``decode_logits`` applies: a native model whose projections are fused."""
    return isinstance(model, NativeCausalLM) and all(
        layer.self_attn.fused is not None and layer.mlp.fused is not None for layer in model.model.layers
    )


@torch.inference_mode()
def decode_logits(
    model: NativeCausalLM,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    cache: KVCache,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [B, V] of the token after each row's ``ids`` [B, 1] (at ``positions`` [B, 1]),
    its keys and values appended to ``cache``: what ``model(ids, attention_mask, positions,
    cache, logits_to_keep=1).logits[:, -1]`` returns, with ``attention_mask`` [B, past + 1]
    (None: every key is seen). A row's position is at most ``past`` (positions count a row's
    real tokens, which the cache holds).

    ``bias``: instead of ``attention_mask``, the additive bias [B, 1, 1, N] of ``decode_bias``
    over N >= past + 1 cache positions (its first past + 1 are used): a generation makes it
    once for all its steps (``generation_bias``) where the mask costs some ten kernels a step."""
    if ids.dim() != 2 or ids.shape[1] != 1:
        raise ValueError(f"decode_logits takes one token per row, ids of shape [B, 1]; got {tuple(ids.shape)}")
    if not can_decode_fast(model):
        raise ValueError("decode_logits needs a native model with fused projections (fuse_projections)")
    backbone = model.model
    batch, past = ids.shape[0], cache.length
    x = F.embedding(ids[:, 0], backbone.embed_tokens.weight)  # [B, hidden]
    cos, sin = rope_lookup(backbone, positions, past + 1, x.dtype)  # [B, 1, D]
    if bias is None:
        bias = decode_bias(attention_mask_4d(attention_mask, past, 1, x.device))
    else:
        bias = bias[..., : past + 1]
    for index, layer in enumerate(backbone.layers):
        attn, mlp = layer.self_attn, layer.mlp
        heads, kv_heads, dim = attn.heads, attn.kv_heads, attn.head_dim
        rotated = heads + kv_heads
        qkv = F.linear(layer.input_layernorm.forward(x), attn.fused.weight, attn.fused.bias)
        qkv = qkv.view(batch, rotated + kv_heads, dim)
        qk = qkv[:, :rotated]
        qk = qk * cos + swap_halves(qk) * sin
        keys, values = cache.append(index, qk[:, heads:, None], qkv[:, rotated:, None])
        out = decode_attention(qk[:, :heads, None], keys, values, bias, dim**-0.5)
        x = _add_projected(x, out.view(batch, heads * dim), attn.o_proj)
        gate, up = F.linear(layer.post_attention_layernorm.forward(x), mlp.fused.weight, mlp.fused.bias).chunk(2, dim=-1)
        x = _add_projected(x, F.silu(gate).mul_(up), mlp.down_proj)
    cache.length = past + 1
    return F.linear(backbone.norm.forward(x), model.lm_head.weight, model.lm_head.bias)


def rope_lookup(backbone: nn.Module, positions: torch.Tensor, bound: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) [B, 1, D] of ``positions`` [B, 1] (each below ``bound``), gathered from
    a table of ``rope_tables`` over every position up to the longest needed so far, kept on the
    backbone per device and dtype: one gather a decode step where computing them is about ten
    kernels (the same elementwise values, to float rounding of the vectorized cos and sin)."""
    device = backbone.inv_freq.device
    tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = backbone.__dict__.setdefault("_rope_by_position", {})
    table = tables.get((device, dtype))
    if table is None or table.shape[0] < bound:
        size = max(bound, 2 * (0 if table is None else table.shape[0]), 256)
        cos, sin = rope_tables(torch.arange(size, device=device)[None], backbone.inv_freq, dtype)  # [1, 1, size, D]
        table = tables[(device, dtype)] = torch.cat((cos[0, 0], sin[0, 0]), dim=-1)  # [size, 2D]
    rows = table.index_select(0, positions.reshape(-1)).view(positions.shape[0], 1, -1)
    dim = table.shape[1] // 2
    return rows[..., :dim], rows[..., dim:]


def generation_bias(attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The ``decode_logits`` bias of every cache position a generation will have: its context's
    ``attention_mask`` [B, W] followed by ``new_tokens`` generated positions, all seen (a decode
    step's query is a generated token, which always sees itself)."""
    mask = torch.cat((attention_mask.bool(), attention_mask.new_ones((attention_mask.shape[0], new_tokens), dtype=torch.bool)), 1)
    bias = decode_bias(mask[:, None, None, :])
    assert bias is not None
    return bias


def _add_projected(x: torch.Tensor, inputs: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """``x + linear(inputs)``: one ``addmm`` where the projection has no bias (the residual is
    added to the product as the separate add would add it), else the two steps."""
    if linear.bias is None:
        return torch.addmm(x, inputs, linear.weight.t())
    return x + F.linear(inputs, linear.weight, linear.bias)
