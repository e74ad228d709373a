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


def unavailable_marks(transport: str) -> list[pytest.MarkDecorator]:
    """None where ``transport`` runs on this machine; else a skip whose reason says why and what
    to install. Every transport stays in every parameter list, so one this machine lacks shows
    up as a skip with its reason (which ``tests/skip_policy.py`` fails), never as a case that
    silently is not there."""
    try:
        check_transport_available(transport)
    except ValueError as exc:
        return [pytest.mark.skip(reason=str(exc))]
    return []


def runnable_pairs() -> list:
    """Every (backend, transport) pair; those this machine cannot run are skipped with the reason."""
    pairs = [pytest.param("naive", "shm", id="naive")]
    for transport in TRANSPORTS.names():
        marks = unavailable_marks(transport)
        for backend in ("bucketed", "delta"):
            pairs.append(pytest.param(backend, transport, id=f"{backend}-{transport}", marks=marks))
    return pairs


def transport_params() -> list:
    """Every transport, as parameters; those this machine cannot run are skipped with the reason."""
    return [pytest.param(name, id=name, marks=unavailable_marks(name)) for name in TRANSPORTS.names()]


def bucketed_pairs() -> list:
    """The bucketed backend over every transport (skipped with the reason where unavailable),
    and the delta backend over shared memory."""
    pairs = [
        pytest.param("bucketed", name, id=f"bucketed-{name}", marks=unavailable_marks(name))
        for name in TRANSPORTS.names()
    ]
    return [*pairs, pytest.param("delta", "shm", id="delta-shm")]


def available_transports() -> list[str]:
    """The transports this machine runs (what a module-scoped fixture builds for the cases of
    ``transport_params`` that are not skipped)."""
    return [name for name in TRANSPORTS.names() if not unavailable_marks(name)]
