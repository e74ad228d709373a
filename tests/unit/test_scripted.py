"""TorchScript for the rollout engine's per-token loops (engines/model/scripted.py): the
compiled decode step and sampling give the very numbers of the same functions run from
Python, and where TorchScript fails the engine runs them from Python, with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import rl_train.engines.model.native_decode as native_decode
import rl_train.engines.model.scripted as scripted_module
from rl_train.engines.model.native import KVCache, NativeCausalLM, NativeConfig, fuse_projections, load_native
from rl_train.engines.model.native_decode import decode_logits, decode_stack, decode_weights, rope_table
from rl_train.engines.model.scripted import scripted
from rl_train.engines.rollout.sampling import sample, sample_tokens


def _model(which: str, tiny_model_dir: Path) -> NativeCausalLM:
    """The demo's policy (float32 or bfloat16), a Llama with biases everywhere and one key/value
    head for four query heads, or plain multi-head attention (a key/value head per head)."""
    if which in ("qwen2", "qwen2-bf16"):
        model = load_native(tiny_model_dir)
        if which == "qwen2-bf16":
            model = model.to(torch.bfloat16)
    else:
        torch.manual_seed(5)
        llama = which == "llama-biased"
        cfg = NativeConfig(
            vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1 if llama else 4, head_dim=8, rms_norm_eps=1e-6, rope_theta=500.0,
            tie_word_embeddings=not llama, qkv_bias=llama, o_bias=llama, mlp_bias=llama, model_type="llama",
        )  # fmt: skip
        model = NativeCausalLM(cfg).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(std=0.3)
    fuse_projections(model)
    return model


def _prefilled(model: NativeCausalLM, rows: int = 5, context: int = 7) -> tuple[KVCache, torch.Tensor]:
    ids = torch.randint(3, model.config.vocab_size, (rows, context), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(context + 4)
    with torch.no_grad():
        model(ids, cache=cache)
    return cache, ids


@pytest.mark.parametrize("which", ["qwen2", "qwen2-bf16", "llama-biased", "multi-head"])
def test_the_scripted_decode_step_is_the_python_one_bit_for_bit(which: str, tiny_model_dir: Path) -> None:
    model = _model(which, tiny_model_dir)
    cache, _ = _prefilled(model)
    compiled = scripted(decode_stack)
    assert compiled is not None
    past = cache.length
    ids = torch.tensor([4, 9, 12, 4, 30])
    positions = torch.full((5,), past)
    table = rope_table(model.model, past + 1, model.model.embed_tokens.weight.dtype)
    bias = torch.zeros(5, 1, 1, past + 1)
    bias[1, ..., :2] = float("-inf")  # a row that does not see its first two keys
    outputs = []
    for run in (decode_stack, compiled):
        keys = [k.clone() for k in cache.keys]
        values = [v.clone() for v in cache.values]
        with torch.no_grad():
            logits = run(ids, positions, past, table, bias, keys, values, *decode_weights(model).tensors)
        outputs.append((logits, keys, values))
    (want, want_keys, want_values), (got, got_keys, got_values) = outputs
    assert got.dtype == model.model.embed_tokens.weight.dtype
    assert torch.equal(got, want)
    for a, b in zip(got_keys + got_values, want_keys + want_values, strict=True):
        assert torch.equal(a[:, :, : past + 1], b[:, :, : past + 1])


def test_the_in_place_rms_norm_is_torch_s_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    for shape in [(256, 64), (3, 64), (2, 5, 32), (1, 896)]:
        x = torch.randn(*shape, generator=generator) * 7
        weight = torch.randn(shape[-1], generator=generator)
        assert torch.equal(native_decode._rms_norm(x, weight, 1e-6), F.rms_norm(x, (shape[-1],), weight, 1e-6))


def test_scripted_sampling_draws_what_python_draws() -> None:
    logits = torch.randn(64, 91, generator=torch.Generator().manual_seed(1)) * 3
    for temperature, top_p in [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)]:
        want = sample(logits, temperature, top_p, torch.Generator().manual_seed(5))
        got = sample_tokens(logits, temperature, top_p, torch.Generator().manual_seed(5))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_without_torchscript_the_same_step_runs_from_python(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = _model("qwen2", tiny_model_dir)
    cache, _ = _prefilled(model)
    ids = torch.tensor([[4], [9], [12], [4], [30]])
    positions = torch.full((5, 1), cache.length)
    fresh = [[k.clone() for k in cache.keys], [v.clone() for v in cache.values]]
    want = decode_logits(model, ids, None, positions, cache)

    def refuse(fn: object) -> object:
        raise RuntimeError("no TorchScript here")

    monkeypatch.setattr(scripted_module, "_compiled", {})
    monkeypatch.setattr(torch.jit, "script", refuse)
    cache.keys, cache.values = fresh
    cache.length -= 1
    with caplog.at_level(logging.WARNING, logger=scripted_module.__name__):
        got = decode_logits(model, ids, None, positions, cache)
    assert scripted(decode_stack) is None
    assert "decode_stack runs from Python (TorchScript failed: no TorchScript here)" in caplog.text
    assert torch.equal(got, want)
    assert sample_tokens(torch.zeros(2, 5), 0.0, 1.0, None)[0].tolist() == [0, 0]


def test_a_cache_without_room_takes_the_module_path_and_grows(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache whose buffers end at the context (capacity unknown): the step grows them
    through the module path, and the next steps, with room again, are the scripted one's."""
    model = _model("qwen2", tiny_model_dir)
    ran: list[int] = []
    compiled = scripted(decode_stack)
    assert compiled is not None

    def counted(fn: object) -> object:
        def run(*args: object) -> torch.Tensor:
            ran.append(int(args[2]))  # past
            return compiled(*args)

        return run

    monkeypatch.setattr(native_decode, "compiled", counted)
    ids = torch.randint(3, model.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(4))
    caches = [model.new_cache(16), model.new_cache(64)]
    with torch.no_grad():
        for cache in caches:
            model(ids, cache=cache)
        for step in range(3):
            token = torch.tensor([[5 + step], [6], [7]])
            positions = torch.full((3, 1), 16 + step)
            first, second = (decode_logits(model, token, None, positions, cache) for cache in caches)
            torch.testing.assert_close(first, second, rtol=1e-6, atol=1e-6)
    assert caches[0].keys[0].shape[2] > 16 and caches[0].length == caches[1].length == 19
    assert ran == [16, 17, 17, 18, 18]  # the full cache's every step; the grown one's from its second


def test_the_switch_turns_torchscript_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scripted_module, "_compiled", {})
    monkeypatch.setenv(scripted_module.SWITCH, "0")
    assert scripted(sample) is None
    monkeypatch.setattr(scripted_module, "_compiled", {})
    monkeypatch.setenv(scripted_module.SWITCH, "1")
    assert scripted(sample) is not None
