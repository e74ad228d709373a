"""The native model (engines/model/native.py) against transformers' own: the same logits with
padding on either side and through the KV cache, the same parameter names, an HF directory
that transformers loads, and a clear choice of implementation (model.impl)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from import_probe import imported_after

from rl_train.engines.model.loading import load_model, resolve_impl, save_policy
from rl_train.engines.model.native import NativeCausalLM, load_native, unsupported_reason
from rl_train.engines.model.tokenizer import load_tokenizer


def _hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Llama: untied head, MLP and attention biases, its own head_dim."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=53, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
        rope_theta=500.0, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    for param in model.parameters():  # biases start at zero: make them matter
        torch.nn.init.normal_(param, std=0.2)
    folder = tmp_path_factory.mktemp("llama") / "model"
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _batch(vocab: int, side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (3, 9), generator=generator)
    mask = torch.ones(3, 9, dtype=torch.long)
    if side == "left":
        mask[0, :4], mask[1, :1] = 0, 0
    else:
        mask[0, 5:], mask[2, 8:] = 0, 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_native_logits_equal_transformers_on_every_real_token(
    which: str, side: str, tiny_model_dir: Path, llama_dir: Path
) -> None:
    folder = tiny_model_dir if which == "qwen2" else llama_dir
    native, reference = load_native(folder), _hf(folder)
    ids, mask, positions = _batch(native.config.vocab_size, side)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = native(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()  # padding positions too: nothing attends to nothing


@pytest.mark.parametrize("capacity", [0, 9])
def test_decoding_through_the_cache_equals_one_full_forward(tiny_model_dir: Path, capacity: int) -> None:
    """Through a cache that grows (capacity unknown) or one sized for the whole generation,
    which then keeps its first buffers: no decode step copies the history into a bigger one."""
    model = load_native(tiny_model_dir)
    ids, mask, positions = _batch(model.config.vocab_size, "left")
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        cache = model.new_cache(capacity)
        prefill = model(ids[:, :5], attention_mask=mask[:, :5], position_ids=positions[:, :5], cache=cache).logits
        first_buffer = cache.keys[0]
        steps = [
            model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], position_ids=positions[:, t : t + 1], cache=cache).logits
            for t in range(5, 9)
        ]  # fmt: skip
    decoded = torch.cat([prefill, *steps], dim=1)
    real = mask.bool()
    torch.testing.assert_close(decoded[real], full[real], rtol=1e-5, atol=1e-5)
    assert cache.length == 9 and cache.keys[0].shape[2] >= 9
    if capacity:
        assert cache.keys[0] is first_buffer and first_buffer.shape[2] == capacity


def test_parameter_names_are_transformers_names(tiny_model_dir: Path, llama_dir: Path) -> None:
    for folder in (tiny_model_dir, llama_dir):
        assert sorted(load_native(folder).state_dict()) == sorted(_hf(folder).state_dict())


def test_a_saved_native_policy_loads_in_transformers_with_the_same_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load_native(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # a trained change the saved copy must carry
    save_policy(model, load_tokenizer(tiny_model_dir), tiny_model_dir, tmp_path / "out")
    ids, mask, positions = _batch(model.config.vocab_size, "right")
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = _hf(tmp_path / "out")(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path / "out")).encode("1+2=3", add_special_tokens=False)


def _edit(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "architectures"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope type 'yarn'"),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope type 'linear'"),
    ],
)
def test_models_it_does_not_cover_load_through_transformers(
    changes: dict, why: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    _edit(folder, **changes)
    reason = unsupported_reason(json.loads((folder / "config.json").read_text()))
    assert reason is not None and why in reason
    assert resolve_impl(folder, "auto") == "transformers"
    with pytest.raises(ValueError, match=f"model.impl=native: .*{why.split()[0]}"):
        resolve_impl(folder, "native")


def test_auto_picks_native_where_it_covers_the_model(tiny_model_dir: Path) -> None:
    assert resolve_impl(tiny_model_dir, "auto") == "native"
    assert isinstance(load_model(tiny_model_dir), NativeCausalLM)
    assert not isinstance(load_model(tiny_model_dir, impl="transformers"), NativeCausalLM)
    with pytest.raises(ValueError, match="model.impl: got 'fast'"):
        resolve_impl(tiny_model_dir, "fast")


def test_loading_the_native_policy_imports_no_transformers(tiny_model_dir: Path) -> None:
    statement = f"from rl_train.engines.model.loading import load_policy; load_policy({str(tiny_model_dir)!r})"
    assert imported_after(statement, ("transformers", "torch._dynamo")) == []


def test_both_implementations_sample_the_same_tokens(tiny_model_dir: Path) -> None:
    from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

    requests = [GenerationRequest(str(i), [1, 5 + i % 9, 15, 5 + i % 7, 18][: 3 + i % 3]) for i in range(24)]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
    results = {
        impl: TorchRolloutEngine(tiny_model_dir, seed=0, model_impl=impl).generate(requests, params)
        for impl in ("native", "transformers")
    }
    for native, reference in zip(results["native"], results["transformers"], strict=True):
        assert native.response_ids == reference.response_ids
        assert native.log_probs == pytest.approx(reference.log_probs, abs=1e-5)


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_fused_projections_give_the_same_logits_and_take_in_place_weight_loads(
    which: str, tiny_model_dir: Path, llama_dir: Path
) -> None:
    """A rollout engine's model projects q/k/v and gate/up with one matmul each: the logits
    are those of the separate projections (to float rounding: a wider matmul may round its last
    bit differently), the state dict keeps its names and shapes, and a
    weight written in place through the state dict (as weight sync writes it, whole or by
    entries) reaches the stacked weights the fused forward reads."""
    from rl_train.engines.model.native import fuse_projections, unfuse_projections

    folder = tiny_model_dir if which == "qwen2" else llama_dir
    plain, fused = load_native(folder), load_native(folder)
    fuse_projections(fused)
    assert fused.model.layers[0].self_attn.fused is not None  # the test is not vacuous
    ids, mask, positions = _batch(plain.config.vocab_size, "left")
    shapes = {k: v.shape for k, v in plain.state_dict().items()}
    assert {k: v.shape for k, v in fused.state_dict().items()} == shapes

    def logits(model: NativeCausalLM) -> torch.Tensor:
        with torch.inference_mode():
            cache = model.new_cache(10)
            model(ids, attention_mask=mask, position_ids=positions, cache=cache)
            step = model(ids[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1), position_ids=positions[:, -1:] + 1, cache=cache)
            return torch.cat([model(ids, attention_mask=mask, position_ids=positions).logits, step.logits], 1)

    torch.testing.assert_close(logits(fused), logits(plain), rtol=1e-5, atol=1e-5)  # float rounding only (1.5e-6 seen on an AMD EPYC)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"):
            new = torch.randn(shapes[name], generator=generator)
            plain.state_dict(keep_vars=True)[name].copy_(new)
            fused.state_dict(keep_vars=True)[name].copy_(new)
        name = "model.layers.1.self_attn.v_proj.weight"
        index, values = torch.tensor([0, 5, 17]), torch.tensor([0.5, -1.0, 2.0])
        for model in (plain, fused):
            model.state_dict(keep_vars=True)[name].view(-1).index_copy_(0, index, values)
    torch.testing.assert_close(logits(fused), logits(plain), rtol=1e-5, atol=1e-5)
    unfuse_projections(fused)
    assert torch.equal(logits(fused), logits(plain))
