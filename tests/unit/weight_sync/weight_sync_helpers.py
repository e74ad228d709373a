"""Shared data of the weight-sync tests: a model's weights, bit comparisons, the pairs to run."""

from __future__ import annotations

import pytest
import torch

from rl_train.engines.weight_sync.transports import TRANSPORTS, check_transport_available

BUCKET_SIZE_BYTES = 64 << 10


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32/bf16/fp16/int/bool tensors, two bigger than a bucket, 300 tiny ones, a scalar, an empty."""
    generator = torch.Generator().manual_seed(seed)
    embed = torch.randn(300, 257, generator=generator)  # 308 KB: chunked over 5+ buckets
    embed[0, :4] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf")])
    weights = {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.qkv_proj.weight": torch.randn(384, 96, generator=generator).to(
            torch.bfloat16
        ),
        "model.layers.0.mlp.down_proj.weight": torch.randn(4099, generator=generator).to(torch.float16),
        "model.layers.0.mlp.router.scale": torch.tensor(0.125),
        "model.position_ids": torch.randint(-(2**40), 2**40, (513,), generator=generator),
        "model.quant.weight": torch.randint(-128, 127, (1000,), dtype=torch.int8, generator=generator),
        "model.attention_mask": torch.rand(77, generator=generator) > 0.5,
        "model.empty": torch.empty(0, 4),
    }
    for i in range(300):
        weights[f"model.norms.{i}.weight"] = torch.randn(i % 5 + 1, generator=generator)
    return weights


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_same_weights(received: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert received.keys() == expected.keys()
    different = [name for name in expected if not same_bits(received[name], expected[name])]
    assert not different, f"tensors differ after sync: {different[:5]}"


def runnable_pairs() -> list:
    """Every (backend, transport) pair; those this machine cannot run are skipped with the reason."""
    pairs = [pytest.param("naive", "shm", id="naive")]
    for transport in TRANSPORTS.names():
        marks = []
        try:
            check_transport_available(transport)
        except ValueError as exc:
            marks = [pytest.mark.skip(reason=str(exc))]
        for backend in ("bucketed", "delta"):
            pairs.append(pytest.param(backend, transport, id=f"{backend}-{transport}", marks=marks))
    return pairs


def available_transports() -> list[str]:
    names = []
    for name in TRANSPORTS.names():
        try:
            check_transport_available(name)
        except ValueError:
            continue
        names.append(name)
    return names
