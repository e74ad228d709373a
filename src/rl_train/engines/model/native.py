"""A plain-torch implementation of the dense Qwen2 / Llama causal LM, loaded from an HF directory.

Why. Importing transformers and its ``modeling_qwen2`` costs a worker about 2.2 s of CPU at
start-up (it pulls in ``torch.distributed.tensor``, ``torch._dynamo`` and sympy), and every
worker of a run starts at once on the same cores; its generic forward also spends most of a
decode step of a small model in Python. This module is the same network in about a hundred
lines of torch, with the same parameter names, so that state dicts, weight sync, checkpoints
and ``save_pretrained`` directories are interchangeable with transformers' model.

What it covers (``unsupported_reason`` says why a model is not covered; such a model loads
through transformers): ``Qwen2ForCausalLM`` and ``LlamaForCausalLM`` with SiLU MLPs, plain
RoPE (no scaling), full attention (no sliding window), grouped-query attention, tied or
untied embeddings. ``tests/unit/test_native_model.py`` holds it to transformers' logits,
with padding on either side and through the KV cache.

The forward takes what the engines pass to transformers' model (``input_ids``,
``attention_mask``, ``position_ids``, ``cache``) and returns an object with ``.logits``.
Masking: a query attends to the keys at or before it whose ``attention_mask`` is 1, and
always to itself, so that a padding position (whose output nobody reads) never attends to
nothing, which would make NaNs that a later layer multiplies by zero weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}


@dataclass(frozen=True)
class NativeConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    model_type: str
    hidden_act: str = "silu"

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> NativeConfig:
        reason = unsupported_reason(hf)
        if reason:
            raise ValueError(f"the native model does not cover this one: {reason}")
        heads = int(hf["num_attention_heads"])
        llama = hf["model_type"] == "llama"
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias if llama else True,
            o_bias=attention_bias if llama else False,
            mlp_bias=bool(hf.get("mlp_bias", False)) if llama else False,
            model_type=str(hf["model_type"]),
        )


def _rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings as either transformers generation writes them."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict):
        return params
    scaling = hf.get("rope_scaling")
    return {"rope_type": (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))} | (
        {"rope_theta": hf["rope_theta"]} if "rope_theta" in hf else {}
    )


def _rope_theta(hf: dict[str, Any]) -> float:
    return float(_rope_parameters(hf).get("rope_theta", hf.get("rope_theta", 10000.0)))


def unsupported_reason(hf: dict[str, Any]) -> str | None:
    """Why the HF config ``hf`` is not one this module implements exactly (None: it is)."""
    architectures = hf.get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in ARCHITECTURES:
        return f"architectures {architectures} (covered: {', '.join(ARCHITECTURES)})"
    if hf.get("model_type") != ARCHITECTURES[architectures[0]]:
        return f"model_type {hf.get('model_type')!r} for {architectures[0]}"
    if hf.get("hidden_act", "silu") != "silu":
        return f"hidden_act {hf.get('hidden_act')!r} (covered: silu)"
    rope_type = _rope_parameters(hf).get("rope_type", "default")
    if rope_type != "default":
        return f"rope type {rope_type!r} (covered: default)"
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in hf.get("layer_types") or []):
        return "sliding-window attention"
    if int(hf.get("pretraining_tp", 1) or 1) != 1:
        return f"pretraining_tp {hf.get('pretraining_tp')}"
    return None


def read_hf_config(path: str | Path) -> dict[str, Any]:
    return dict(json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's fused kernel: the same float32 result as the steps below, in one pass
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(cfg: NativeConfig) -> torch.Tensor:
    """RoPE's 1 / theta^(2i/d), in float32 (as transformers computes them)."""
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """The last dimension's two halves swapped. RoPE is ``x * cos + rotate_half(x) * sin`` with
    ``rotate_half(x) = (-x2, x1)``; here the minus sign lives in ``sin`` (``rope_tables``), computed
    once per forward instead of negating q and k in every layer (the product is the same bits)."""
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


def rope_tables(position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) [B, 1, T, D] of the positions: cos of the angles repeated over both
    halves, and sin with its first half negated (for ``swap_halves``)."""
    freqs = (position_ids[..., None].float() * inv_freq.to(position_ids.device))[:, None]  # [B, 1, T, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)


class KVCache:
    """Keys and values of every layer for the tokens fed so far, in buffers that grow by
    doubling (a decode step writes one position instead of copying the whole history).

    ``capacity``: the positions a generation will need at most (its widest context plus its
    new tokens), when the caller knows them; the first buffers hold that many, so the decode
    never grows them. Growing copies every layer's whole history: at 256 rows x 32 new tokens
    the copies were 0.4 ms of a 9 ms decode step."""

    def __init__(self, capacity: int = 0) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0
        """Positions held (the same in every layer once a forward has finished)."""
        self.capacity = capacity

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this forward's ``key`` / ``value`` [B, H, T, D] to ``layer``; every position so far."""
        start, end = self.length, self.length + key.shape[2]
        if layer == len(self.keys):
            self.keys.append(self._buffer(key, end, self.capacity))
            self.values.append(self._buffer(value, end, self.capacity))
        elif end > self.keys[layer].shape[2]:
            for store in (self.keys, self.values):
                grown = self._buffer(store[layer], end)
                grown[:, :, :start] = store[layer][:, :, :start]
                store[layer] = grown
        self.keys[layer][:, :, start:end] = key
        self.values[layer][:, :, start:end] = value
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def adopt(self, keys: list[torch.Tensor], values: list[torch.Tensor], length: int) -> None:
        """Start from these buffers per layer [B, KV heads, room, D], whose first ``length``
        positions hold keys and values kept from earlier forwards: the next forward feeds
        position ``length`` on."""
        if self.keys:
            raise ValueError("adopt is for an empty cache")
        self.keys, self.values, self.length = list(keys), list(values), length

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` [B'] of every layer, in that order and repeats allowed (the
        cache of distinct prompts becomes the cache of a batch that repeats them)."""
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]

    @staticmethod
    def _buffer(like: torch.Tensor, needed: int, capacity: int = 0) -> torch.Tensor:
        """Room for ``needed`` positions: ``capacity`` when that is enough, else twice ``needed``."""
        size = capacity if needed <= capacity else max(2 * needed, 16)
        return like.new_empty((like.shape[0], like.shape[1], size, like.shape[3]))


class Attention(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.fused: Fused | None = None
        """q, k and v projected by one matmul (``fuse_projections``; inference only)."""

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        if self.fused is not None:
            q, k, v = self._fused_qkv(x, cos, sin)
        else:
            q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + swap_halves(q) * sin
            k = k * cos + swap_halves(k) * sin
        if cache is not None:
            k, v = cache.append(layer, k, v)
        if length == 1:  # a decode step: ``mask`` is the additive bias of ``decode_bias``
            out = decode_attention(q, k, v, mask, self.head_dim**-0.5)
        else:
            # Grouped-query attention reads each key/value head in place (no copy of the whole
            # cache per query head and layer).
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.head_dim**-0.5,
                enable_gqa=self.kv_heads != self.heads,
            )  # fmt: skip
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))

    def _fused_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k (rotated, in one pass over both) and v [B, heads, T, D] from one matmul."""
        assert self.fused is not None
        batch, length, _ = x.shape
        rotated = self.heads + self.kv_heads
        qkv = F.linear(x, self.fused.weight, self.fused.bias)
        qkv = qkv.view(batch, length, rotated + self.kv_heads, self.head_dim).transpose(1, 2)
        qk, v = qkv[:, :rotated], qkv[:, rotated:]
        # one kernel for the product and the sum (a decode step: 0.98x the time of a generation;
        # the same values to the last bit's rounding)
        qk = torch.addcmul(qk * cos, swap_halves(qk), sin)
        return qk[:, : self.heads], qk[:, self.heads :], v


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention of one query per row, q [B, H, 1, D], over the keys and values [B, KVH, T, D]
    (bias [B, 1, 1, T] float32 from ``decode_bias``, 0 where a key is seen and -inf where it is
    not, or None for every key): each group of H / KVH query heads reads its key/value head
    through one batched matmul. For a single query this costs 0.4x what the fused CPU attention
    kernel does (measured at 256 rows, 37 keys); its result agrees to float rounding (7e-7).
    The scale and the bias are applied in place on the fresh scores (two kernels where a scaled
    copy, a negated mask and a masked copy were four)."""
    batch, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float()  # [B, KVH, H / KVH, T]
    scores.mul_(scale)
    if bias is not None:
        scores.add_(bias)
    weights = scores.softmax(-1).to(v.dtype)
    return torch.matmul(weights, v).reshape(batch, heads, 1, dim)


def decode_bias(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The boolean mask [B, 1, 1, T] of a decode step as the additive float32 bias that
    ``decode_attention`` adds to its scores, made once per forward for every layer."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))


class MLP(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.fused: Fused | None = None
        """gate and up projected by one matmul (``fuse_projections``; inference only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            gate, up = F.linear(x, self.fused.weight, self.fused.bias).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate).mul_(up))  # in place: no autograd here
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class Fused:
    """Several projections' weights (and biases) stacked in one tensor, each projection's
    own parameter a view of its rows, so that writing a parameter in place writes the stack."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def _fuse(linears: list[nn.Linear]) -> Fused:
    """Stack ``linears`` (same input size) and make each one's parameters views of the stack."""
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears])
        has_bias = [lin.bias is not None for lin in linears]
        if any(has_bias) and not all(has_bias):
            raise ValueError("fusing projections of which only some have a bias")
        bias = torch.cat([lin.bias for lin in linears]) if all(has_bias) else None
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return Fused(weight, bias)


def fuse_projections(model: NativeCausalLM) -> None:
    """For inference only (a rollout engine's model, never trained): each layer projects q, k
    and v with one matmul, and gate and up with another, on stacked weights; the HF-named
    parameters become views of the stacks, so the names, the state dict and in-place weight
    loads (``copy_``, ``index_copy_``) are unchanged and reach the stacks. The same results to
    float rounding (each output column is the same dot product, though a wider matmul may round
    its last bit differently). A generation of 256 rows x 32 tokens: 0.94x the time.

    Anything that replaces a parameter's storage (``.data =``, moving the model to another
    device) cuts it from its stack: call ``unfuse_projections`` before and this again after."""
    for layer in model.model.decoder_layers():
        attn, mlp = layer.self_attn, layer.mlp
        attn.fused = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.fused = _fuse([mlp.gate_proj, mlp.up_proj])


def unfuse_projections(model: NativeCausalLM) -> None:
    """Back to one matmul per projection (the parameters keep their values)."""
    for layer in model.model.decoder_layers():
        layer.self_attn.fused = None
        layer.mlp.fused = None


class DecoderLayer(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: KVCache | None, layer: int) -> torch.Tensor:  # fmt: skip
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The decoder stack (transformers' ``model.model``): token ids to final hidden states."""

    inv_freq: torch.Tensor
    """A buffer (``register_buffer``), declared here because the type checker cannot see buffers."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inverse_frequencies(cfg), persistent=False)

    def decoder_layers(self) -> list[DecoderLayer]:
        """``layers`` with their type: an ``nn.ModuleList`` holds any module as far as the type
        checker knows, and ``__init__`` fills this one with ``DecoderLayer`` only."""
        return list(cast("Iterable[DecoderLayer]", self.layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        batch, length = input_ids.shape
        past = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=input_ids.device).expand(batch, length)
        x = self.embed_tokens(input_ids)
        cos, sin = rope_tables(position_ids, self.inv_freq, x.dtype)
        mask = attention_mask_4d(attention_mask, past, length, x.device)
        if length == 1:
            mask = decode_bias(mask)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, index)
        if cache is not None:
            cache.length = past + length
        return self.norm(x)


def attention_mask_4d(attention_mask: torch.Tensor | None, past: int, length: int, device: torch.device) -> torch.Tensor | None:
    """[B, 1, T, past+T] booleans (see the module docstring), or None for plain causal (and
    for a single query after the cache, which attends to every key)."""
    if attention_mask is None and (past == 0 or length == 1):
        return None
    keys = past + length
    query_at = torch.arange(past, keys, device=device)[:, None]
    key_at = torch.arange(keys, device=device)[None, :]
    allowed = key_at <= query_at
    if attention_mask is not None:
        allowed = (allowed & attention_mask[:, None, None, -keys:].bool()) | (key_at == query_at)
    return allowed if allowed.dim() == 4 else allowed[None, None]


@dataclass
class CausalLMOutput:
    logits: torch.Tensor


class NativeCausalLM(nn.Module):
    """``model`` (the backbone) and ``lm_head``, named as transformers names them."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        logits_to_keep: int = 0,
    ) -> CausalLMOutput:
        """Logits of every position, or of the last ``logits_to_keep`` (0: all), as
        transformers' argument of that name (a decode step needs the last one only)."""
        hidden = self.model(input_ids, attention_mask, position_ids, cache)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutput(self.lm_head(hidden))

    @staticmethod
    def new_cache(capacity: int = 0) -> KVCache:
        """An empty cache; ``capacity``: the positions it will need at most (0: unknown)."""
        return KVCache(capacity)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


META_ABOVE_PARAMETERS = 50_000_000


def approx_parameters(cfg: NativeConfig) -> int:
    attention = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    layer = attention + 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_hidden_layers * layer + cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)


def load_native(path: str | Path, dtype: torch.dtype = torch.float32) -> NativeCausalLM:
    """The model of the HF directory ``path`` (safetensors weights, one file or an index)."""
    from safetensors.torch import load_file

    folder = Path(path)
    cfg = NativeConfig.from_hf(read_hf_config(folder))
    # A big model is built on the meta device (no memory, no random init) and the weights
    # assigned; the first use of meta costs about 1.7 s of imports (torch's decompositions), more
    # than building a small model for real and overwriting its random weights.
    with torch.device("meta" if approx_parameters(cfg) > META_ABOVE_PARAMETERS else "cpu"):
        model = NativeCausalLM(cfg)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights (the native model reads safetensors only)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(
            f"{folder}: weights do not match a {cfg.model_type} of this config "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.inv_freq = rope_inverse_frequencies(cfg)  # a buffer: not in the weights
    return model.eval()


def save_native(model: NativeCausalLM, source: str | Path, out: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """An HF directory at ``out``: the weights as safetensors (the tied head left out, as
    transformers writes it) beside ``source``'s config and generation config."""
    from safetensors.torch import save_file

    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    weights = dict(state if state is not None else model.state_dict())
    if model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(target / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        if (Path(source) / name).is_file() and not (target / name).exists():
            (target / name).write_bytes((Path(source) / name).read_bytes())
