"""A decode step without the modules (engines/model/native_decode.py) against the module forward:
the same logits and the same cache, padded or not, with biases everywhere and grouped heads,
and the rollout engine's generations the same through either."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rl_train.engines.rollout.torch_engine as torch_engine
from rl_train.engines.model.native import (
    NativeCausalLM,
    NativeConfig,
    fuse_projections,
    load_native,
    rope_tables,
)
from rl_train.engines.model.native_decode import can_decode_fast, decode_logits, generation_bias, rope_table
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

TIGHT = {"rtol": 1e-6, "atol": 1e-6}
"""The same kernels on the same numbers: equal on this CPU; the margin is for a BLAS that
rounds a fused residual add differently."""


def _biased_llama() -> NativeCausalLM:
    """Biases on q/k/v, o and the MLP, one key/value head for four query heads, an untied head."""
    torch.manual_seed(5)
    cfg = NativeConfig(
        vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=False,
        qkv_bias=True, o_bias=True, mlp_bias=True, model_type="llama",
    )  # fmt: skip
    model = NativeCausalLM(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.3)
    return model


def _left_padded(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (4, 10), generator=generator)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[0, :3], mask[2, :1] = 0, 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_decode_steps_equal_the_module_forward(which: str, padded: bool, tiny_model_dir: Path) -> None:
    model = load_native(tiny_model_dir) if which == "qwen2" else _biased_llama()
    fuse_projections(model)
    assert can_decode_fast(model)
    ids, mask, positions = _left_padded(model.config.vocab_size)
    if not padded:
        mask = torch.ones_like(mask)
        positions = torch.arange(10).expand(4, 10)
    with torch.no_grad():
        caches = [model.new_cache(10), model.new_cache(10)]
        for cache in caches:
            model(ids[:, :6], attention_mask=mask[:, :6] if padded else None, position_ids=positions[:, :6], cache=cache)
        for t in range(6, 10):
            step_mask = mask[:, : t + 1] if padded else None
            want = model(
                ids[:, t : t + 1], attention_mask=step_mask, position_ids=positions[:, t : t + 1], cache=caches[0],
                logits_to_keep=1,
            ).logits[:, -1]  # fmt: skip
            got = decode_logits(model, ids[:, t : t + 1], step_mask, positions[:, t : t + 1], caches[1])
            torch.testing.assert_close(got, want, **TIGHT)
    assert caches[1].length == caches[0].length == 10
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(caches[1].keys[layer][:, :, :10], caches[0].keys[layer][:, :, :10], **TIGHT)
        torch.testing.assert_close(caches[1].values[layer][:, :, :10], caches[0].values[layer][:, :, :10], **TIGHT)


def test_decode_logits_refuses_what_it_does_not_cover(tiny_model_dir: Path) -> None:
    model = load_native(tiny_model_dir)
    ids = torch.tensor([[5], [6]])
    with pytest.raises(ValueError, match="fused projections"):
        decode_logits(model, ids, None, torch.zeros_like(ids), model.new_cache())
    fuse_projections(model)
    with pytest.raises(ValueError, match=r"one token per row.*\(2, 3\)"):
        decode_logits(model, torch.ones(2, 3, dtype=torch.long), None, torch.zeros(2, 3, dtype=torch.long), model.new_cache())


def test_the_engine_generates_the_same_through_either_decode(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return decode_logits(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_engine, "decode_logits", counted)
    engine = TorchRolloutEngine(tiny_model_dir, seed=0)
    tokens = engine.tokenizer.encode
    requests = [
        GenerationRequest(str(i), [engine.tokenizer.bos_token_id, *tokens(text, add_special_tokens=False)])
        for i, text in enumerate(["3+4=", "3+4=", "12+5=", "7+1=", "3+4="])
    ]  # one length apart: a padded batch, with repeated prompts
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    fast = engine.generate(requests, params)
    assert calls  # the decode steps did go through native_decode
    engine.fast_decode = False
    count = len(calls)
    plain = engine.generate(requests, params)
    assert len(calls) == count
    for a, b in zip(fast, plain, strict=True):
        assert a.response_ids == b.response_ids and a.stop_reason == b.stop_reason
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)


def test_a_generation_bias_and_the_rope_table_give_the_steps_of_the_mask(tiny_model_dir: Path) -> None:
    """The bias made once for a generation, and RoPE gathered from the table (grown past its first
    size), give what the step's own mask and RoPE give."""
    model = load_native(tiny_model_dir)
    fuse_projections(model)
    ids, mask, positions = _left_padded(model.config.vocab_size)
    bias = generation_bias(mask[:, :6], 4)
    assert bias.shape == (4, 1, 1, 10)
    with torch.no_grad():
        caches = [model.new_cache(10), model.new_cache(10)]
        for cache in caches:
            model(ids[:, :6], attention_mask=mask[:, :6], position_ids=positions[:, :6], cache=cache)
        for t in range(6, 10):
            step_mask = torch.cat([mask[:, :6], torch.ones(4, t - 5, dtype=torch.long)], dim=1)
            want = decode_logits(model, ids[:, t : t + 1], step_mask, positions[:, t : t + 1], caches[0])
            got = decode_logits(model, ids[:, t : t + 1], None, positions[:, t : t + 1], caches[1], bias)
            torch.testing.assert_close(got, want, **TIGHT)
    far = torch.tensor([[3], [300], [1000]])
    table = rope_table(model.model, 1001, torch.float32)
    cos, sin = table[far.view(-1)].view(3, 1, -1).chunk(2, dim=-1)
    want_cos, want_sin = rope_tables(far, model.model.inv_freq, torch.float32)
    torch.testing.assert_close(cos, want_cos.view(3, 1, -1), **TIGHT)
    torch.testing.assert_close(sin, want_sin.view(3, 1, -1), **TIGHT)
