"""One decode step of the native model (one new token per row) without going through its modules.

Why. At 256 rows of the demo's 64-wide policy a decode step is some 120 small kernels, and
the modules' calls around them (``nn.Module.__call__``, the [B, 1, ...] views and transposes
of a general forward, a separate kernel for each residual add) are a measurable share of it.
This is the same step written as straight calls on the same weights (``decode_stack``): the
residual adds are folded into the output projections' matmuls (``addmm``), and q, k and v
stay [B, heads, D]. Its logits and the keys and values it writes to the cache are the module
forward's to float rounding (``tests/unit/test_native_decode.py``). It is compiled by
TorchScript where it can be (``scripted.py``), else it runs from Python, with the same bits.

It reads the stacked q/k/v and gate/up weights that ``fuse_projections`` makes (a rollout
engine's model); ``can_decode_fast`` says whether a model has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rl_train.engines.model.native import (
    Backbone,
    Fused,
    KVCache,
    NativeCausalLM,
    attention_mask_4d,
    decode_bias,
    rope_tables,
)
from rl_train.engines.model.scripted import scripted as compiled


def can_decode_fast(model: nn.Module) -> bool:
    """Whether ``decode_logits`` applies: a native model whose projections are fused."""
    return isinstance(model, NativeCausalLM) and all(
        layer.self_attn.fused is not None and layer.mlp.fused is not None for layer in model.model.decoder_layers()
    )


@torch.inference_mode()
def decode_logits(
    model: NativeCausalLM,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    cache: KVCache,
    bias: torch.Tensor | None = None,
    weights: DecodeWeights | None = None,
) -> torch.Tensor:
    """Logits [B, V] of the token after each row's ``ids`` [B, 1] (at ``positions`` [B, 1]),
    its keys and values appended to ``cache``: what ``model(ids, attention_mask, positions,
    cache, logits_to_keep=1).logits[:, -1]`` returns, with ``attention_mask`` [B, past + 1]
    (None: every key is seen). A row's position is at most ``past`` (positions count a row's
    real tokens, which the cache holds).

    ``bias``: instead of ``attention_mask``, the additive bias [B, 1, 1, N] of ``decode_bias``
    over N >= past + 1 cache positions (its first past + 1 are used): a generation makes it
    once for all its steps (``generation_bias``) where the mask costs some ten kernels a step.
    ``weights``: ``decode_weights(model)``, which a generation gathers once for all its steps
    (the model's weights are written in place while it decodes, never replaced)."""
    if ids.dim() != 2 or ids.shape[1] != 1:
        raise ValueError(f"decode_logits takes one token per row, ids of shape [B, 1]; got {tuple(ids.shape)}")
    if weights is None:
        weights = decode_weights(model)
    past = cache.length
    if not _cache_holds(cache, weights.layers, past + 1):
        # a cache without room for this step (or none yet): the module forward makes and grows it
        if attention_mask is None and bias is not None:
            attention_mask = (bias[:, 0, 0, : past + 1] == 0).long()
        return model(ids, attention_mask, positions, cache, logits_to_keep=1).logits[:, -1]
    backbone = model.model
    embedding = backbone.embed_tokens.weight
    if bias is None:
        bias = decode_bias(attention_mask_4d(attention_mask, past, 1, embedding.device))
    else:
        bias = bias[..., : past + 1]
    run = compiled(decode_stack) or decode_stack
    table = rope_table(backbone, past + 1, embedding.dtype)
    logits = run(ids.reshape(-1), positions.reshape(-1), past, table, bias, cache.keys, cache.values, *weights.tensors)
    cache.length = past + 1
    return logits


def rope_table(backbone: Backbone, bound: int, dtype: torch.dtype) -> torch.Tensor:
    """[N, 2D]: each position's cos and signed sin (``rope_tables``) side by side, for every
    position up to the longest needed so far (N >= ``bound``), kept on the backbone per device
    and dtype."""
    device = backbone.inv_freq.device
    tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = backbone.__dict__.setdefault("_rope_by_position", {})
    table = tables.get((device, dtype))
    if table is None or table.shape[0] < bound:
        size = max(bound, 2 * (0 if table is None else table.shape[0]), 256)
        cos, sin = rope_tables(torch.arange(size, device=device)[None], backbone.inv_freq, dtype)  # [1, 1, size, D]
        table = tables[(device, dtype)] = torch.cat((cos[0, 0], sin[0, 0]), dim=-1)  # [size, 2D]
    return table


def generation_bias(attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The ``decode_logits`` bias of every cache position a generation will have: its context's
    ``attention_mask`` [B, W] followed by ``new_tokens`` generated positions, all seen (a decode
    step's query is a generated token, which always sees itself)."""
    mask = torch.cat((attention_mask.bool(), attention_mask.new_ones((attention_mask.shape[0], new_tokens), dtype=torch.bool)), 1)
    bias = decode_bias(mask[:, None, None, :])
    assert bias is not None
    return bias


def _cache_holds(cache: KVCache, layers: int, positions: int) -> bool:
    """Whether every layer of ``cache`` has a buffer with room for ``positions`` (the scripted
    step writes into the buffers; the module path makes and grows them)."""
    return len(cache.keys) == layers and all(keys.shape[2] >= positions for keys in cache.keys)


@dataclass(frozen=True)
class DecodeWeights:
    """The tensors ``decode_stack`` reads after the cache, in its argument order."""

    layers: int
    tensors: tuple[Any, ...]


def decode_weights(model: NativeCausalLM) -> DecodeWeights:
    """``model``'s weights as ``decode_logits`` reads them. They stay valid while the model's
    weights are written in place (weight sync); gather them again after anything that replaces
    a weight's storage (sleep and wake, ``fuse_projections``)."""
    if not can_decode_fast(model):
        raise ValueError(_NOT_FUSED)
    layers = model.model.decoder_layers()
    attn = [layer.self_attn for layer in layers]
    mlp = [layer.mlp for layer in layers]
    qkv = [_stacked(a.fused) for a in attn]
    gate_up = [_stacked(m.fused) for m in mlp]
    first = attn[0]
    tensors = (
        model.model.embed_tokens.weight,
        [layer.input_layernorm.weight for layer in layers],
        [f.weight for f in qkv],
        [f.bias for f in qkv],
        [a.o_proj.weight for a in attn],
        [a.o_proj.bias for a in attn],
        [layer.post_attention_layernorm.weight for layer in layers],
        [f.weight for f in gate_up],
        [f.bias for f in gate_up],
        [m.down_proj.weight for m in mlp],
        [m.down_proj.bias for m in mlp],
        model.model.norm.weight,
        model.lm_head.weight,
        model.lm_head.bias,
        model.config.rms_norm_eps,
        first.heads,
        first.kv_heads,
        first.head_dim,
    )
    return DecodeWeights(len(layers), tensors)


_NOT_FUSED = "decode_logits needs a native model with fused projections (fuse_projections)"


def _stacked(fused: Fused | None) -> Fused:
    """A projection's stacked weights (``can_decode_fast`` checked that every layer has them)."""
    if fused is None:
        raise ValueError(_NOT_FUSED)
    return fused


def decode_stack(
    ids: torch.Tensor,
    positions: torch.Tensor,
    past: int,
    rope: torch.Tensor,
    bias: torch.Tensor | None,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    embedding: torch.Tensor,
    input_norms: list[torch.Tensor],
    qkv_weights: list[torch.Tensor],
    qkv_biases: list[torch.Tensor | None],
    o_weights: list[torch.Tensor],
    o_biases: list[torch.Tensor | None],
    post_norms: list[torch.Tensor],
    gate_up_weights: list[torch.Tensor],
    gate_up_biases: list[torch.Tensor | None],
    down_weights: list[torch.Tensor],
    down_biases: list[torch.Tensor | None],
    final_norm: torch.Tensor,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    eps: float,
    heads: int,
    kv_heads: int,
    dim: int,
) -> torch.Tensor:
    """The body of ``decode_logits`` on plain tensors, for TorchScript: the same kernels on the
    same numbers in the same order (each one's Python call was a measurable share of a step
    of a small model). ``ids`` and ``positions`` [B]; ``rope``: ``rope_table``; ``keys`` /
    ``values``: the cache's buffers, each with room for position ``past``, where this step's
    keys and values are written."""
    x = F.embedding(ids, embedding)
    batch = x.shape[0]
    rows = rope.index_select(0, positions).view(batch, 1, 2 * dim)
    cos, sin = rows.narrow(2, 0, dim), rows.narrow(2, dim, dim)
    rotated = heads + kv_heads
    group = heads // kv_heads
    half = dim // 2
    scale = dim**-0.5
    # narrow/select rather than x[:, :, a:b]: TorchScript runs a slice op for every ':'
    for index in range(len(qkv_weights)):
        layer_keys, layer_values = keys[index], values[index]
        qkv = F.linear(_rms_norm(x, input_norms[index], eps), qkv_weights[index], qkv_biases[index])
        qkv = qkv.view(batch, rotated + kv_heads, dim)
        qk = qkv.narrow(1, 0, rotated)
        qk = torch.addcmul(qk * cos, qk.roll(half, -1), sin)  # roll by half a head: swap_halves
        layer_keys.select(2, past).copy_(qk.narrow(1, heads, kv_heads))
        layer_values.select(2, past).copy_(qkv.narrow(1, rotated, kv_heads))
        grouped = qk.narrow(1, 0, heads).reshape(batch, kv_heads, group, dim)
        scores = torch.matmul(grouped, layer_keys.narrow(2, 0, past + 1).transpose(2, 3))
        if scores.dtype != torch.float32:
            scores = scores.float()
        scores.mul_(scale)
        if bias is not None:
            scores.add_(bias)
        weights = scores.softmax(-1)
        if weights.dtype != layer_values.dtype:
            weights = weights.to(layer_values.dtype)
        out = torch.matmul(weights, layer_values.narrow(2, 0, past + 1)).view(batch, heads * dim)
        if o_biases[index] is None:
            x = torch.addmm(x, out, o_weights[index].t())
        else:
            x = x + F.linear(out, o_weights[index], o_biases[index])
        gate_up = F.linear(_rms_norm(x, post_norms[index], eps), gate_up_weights[index], gate_up_biases[index])
        gate, up = gate_up.chunk(2, dim=-1)
        if down_biases[index] is None:
            x = torch.addmm(x, F.silu(gate).mul_(up), down_weights[index].t())
        else:
            x = x + F.linear(F.silu(gate).mul_(up), down_weights[index], down_biases[index])
    return F.linear(_rms_norm(x, final_norm, eps), head_weight, head_bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm.forward``'s values. In float32 on the CPU its ``F.rms_norm`` is these steps
    plus a dozen dispatches and copies of its own (the same bits: ``test_scripted.py``); in
    place here, 0.98x the time of a generation at 256 x 32. On a GPU it is one fused kernel,
    which sums in another order: that one runs there."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if x.is_cuda:
            return F.rms_norm(x, [weight.shape[0]], weight, eps)
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))).mul_(weight)
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)
