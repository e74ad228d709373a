"""The sglang backend against an sglang-compatible server on CPU (``cpu_server.py``), over HTTP:
the failures a real server can show, each a clear error that leaves no half-done batch, and
the weight update over a torch.distributed group. (The ``RolloutEngine`` contract itself:
tests/unit/test_engine_conformance.py, which runs every case against this server too.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.rollout.sglang.client import RolloutServerError
from rl_train.engines.rollout.sglang.engine import SglangRolloutEngine


@pytest.fixture
def engine(tiny_model_dir: Path, sglang_options: dict[str, Any]) -> Iterator[SglangRolloutEngine]:
    built = build_rollout_engine("sglang", tiny_model_dir, seed=1, options=sglang_options)
    assert isinstance(built, SglangRolloutEngine)
    yield built
    built.close()


def _requests(engine: SglangRolloutEngine, count: int) -> list[GenerationRequest]:
    ids = [engine.tokenizer.bos_token_id, *engine.tokenizer.encode("3+4=", add_special_tokens=False)]
    return [GenerationRequest(f"p/{j}", ids) for j in range(count)]


def _fault(server: str, **fault: Any) -> None:
    httpx.post(f"{server}/test/fault", json=fault, timeout=10).raise_for_status()


def test_the_samples_of_one_prompt_differ_and_a_seed_repeats_them(engine: SglangRolloutEngine) -> None:
    """Each request gets its own sampling seed (n samples of a prompt must not be n copies)."""
    params = SamplingParams(1.0, 1.0, 5, seed=7, ignore_eos=True)
    first = engine.generate(_requests(engine, 8), params)
    assert len({tuple(r.response_ids) for r in first}) > 1
    again = engine.generate(_requests(engine, 8), params)
    assert [r.response_ids for r in again] == [r.response_ids for r in first]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"mode": "malformed"}, "/generate: malformed answer: a result without meta_info"),
        ({"mode": "error"}, "/generate: HTTP 500: injected server error"),
        ({"mode": "slow", "seconds": 3}, "/generate: no answer within the timeout"),
    ],
)
def test_a_failed_generate_is_a_clear_error_and_leaves_nothing_half_done(
    tiny_model_dir: Path, sglang_server: str, sglang_options: dict[str, Any], fault: dict, message: str
) -> None:
    engine = build_rollout_engine(
        "sglang", tiny_model_dir, seed=1, options={**sglang_options, "request_timeout_s": 1.0}
    )
    assert isinstance(engine, SglangRolloutEngine)
    try:
        _fault(sglang_server, **fault, times=1)
        with pytest.raises(RolloutServerError, match=message):
            engine.generate(_requests(engine, 4), SamplingParams(1.0, 1.0, 4))
        assert engine._in_flight == 0  # nothing left counted as running
        results = engine.generate(_requests(engine, 4), SamplingParams(1.0, 1.0, 4))  # the fault was once
        assert [r.request_id for r in results] == ["p/0", "p/1", "p/2", "p/3"]
    finally:
        engine.close()


def test_an_unreachable_server_is_named(tiny_model_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    engine = build_rollout_engine(
        "sglang", tiny_model_dir, options={"url": f"http://127.0.0.1:{port}", "connect_timeout_s": 2.0}
    )
    with pytest.raises(RolloutServerError, match=rf"sglang server http://127.0.0.1:{port}/generate: not reachable"):
        engine.generate(_requests(engine, 2), SamplingParams())  # type: ignore[arg-type]
    engine.close()  # type: ignore[attr-defined]


def test_a_failed_weight_update_keeps_the_served_version(
    engine: SglangRolloutEngine, sglang_server: str
) -> None:
    weights = {name: tensor + 0.5 for name, tensor in engine.export_weights()}
    _fault(sglang_server, mode="error", times=1, endpoint="/update_weights_from_disk")
    with pytest.raises(RolloutServerError, match="update_weights_from_disk: HTTP 500"):
        engine.update_weights(weights.items(), version=4)
    assert engine.version == 0
    engine.update_weights(weights.items(), version=4)
    assert engine.version == 4
    assert all(torch.equal(t, weights[n]) for n, t in engine.export_weights())


def test_weights_broadcast_over_a_group_the_server_joins(
    tiny_model_dir: Path, sglang_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """weight_update=distributed: the server joins a two-party gloo group once; each update
    tells it the names, dtypes and shapes and broadcasts the tensors; it serves them at once."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    engine = build_rollout_engine(
        "sglang", tiny_model_dir, options={**sglang_options, "weight_update": "distributed"}
    )
    assert isinstance(engine, SglangRolloutEngine)
    try:
        original = dict(engine.export_weights())
        for version, shift in ((1, 0.25), (2, -0.5)):
            pushed = {name: tensor + shift for name, tensor in original.items()}
            engine.update_weights(pushed.items(), version)
            assert engine.version == version
            assert all(torch.equal(t, pushed[n]) for n, t in engine.export_weights())
        assert engine._group is not None
    finally:
        engine.close()
