"""The sglang backend against a real sglang server on a GPU (``gpu``-marked; run by
``scripts/gpu_check.sh``): launched by the backend itself from the built-in policy, then the
contract that the CPU test server stands in for everywhere else: log-probs that the training
engine reproduces, abort, sleep and wake, weights from disk and over an NCCL group, LoRA
adapters synced alone through sglang's own LoRA serving, and a stop that leaves no process behind."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.registry import build_training_engine
from rl_train.storage.records import collate, scatter_response

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed"),
]

LAUNCH = ["--dtype", "float32", "--mem-fraction-static", "0.3", "--disable-cuda-graph"]


def _requests(tokenizer, count: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(str(i), [tokenizer.bos_token_id, *tokenizer.encode(f"{i % 10}+{i % 7}=", add_special_tokens=False)])
        for i in range(count)
    ]


@pytest.mark.parametrize("weight_update", ["disk", "distributed"])
def test_a_launched_sglang_server_honours_the_rollout_contract(tiny_model_dir: Path, weight_update: str) -> None:
    engine = build_rollout_engine(
        "sglang", tiny_model_dir, seed=0, options={"launch_args": LAUNCH, "weight_update": weight_update}
    )
    server = engine._server  # type: ignore[attr-defined]
    try:
        trainer = build_training_engine("torch", tiny_model_dir, ActorConfig(lr=1e-2), 10, 1.0, seed=0)
        params = SamplingParams(1.0, 1.0, 6)
        results = engine.generate(_requests(engine.tokenizer, 16), params)
        records = [
            {
                "prompt_ids": r.prompt_ids,
                "response_ids": r.response_ids,
                "old_log_probs": r.log_probs,
                "advantages": [1.0] * len(r.response_ids),
            }
            for r in results
        ]
        trainer.train_batch(
            collate(records, int(trainer.tokenizer.pad_token_id), ["old_log_probs", "advantages"]),
            build_actor_loss_fn(ActorConfig()),
        )
        engine.update_weights(trainer.export_weights(), version=1)
        again = engine.generate(_requests(engine.tokenizer, 16), params)
        served = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in again]
        batch = collate(served, int(trainer.tokenizer.pad_token_id))
        recomputed = scatter_response(trainer.compute_log_probs(batch)["log_probs"], served)
        for result, log_probs in zip(again, recomputed, strict=True):
            assert result.token_versions == [1] * len(result.log_probs)
            torch.testing.assert_close(torch.tensor(log_probs), torch.tensor(result.log_probs), atol=2e-3, rtol=0)

        out: list = []
        thread = threading.Thread(
            target=lambda: out.extend(
                engine.generate(_requests(engine.tokenizer, 4), SamplingParams(1.0, 1.0, 200, ignore_eos=True))
            )
        )
        thread.start()
        while engine.running_requests() == 0:  # type: ignore[attr-defined]
            time.sleep(0.01)
        engine.abort()
        thread.join(60)
        assert [r.stop_reason for r in out] == ["aborted"] * 4

        engine.sleep()
        engine.update_weights(trainer.export_weights(), version=2)
        engine.wake_up()
        assert engine.version == 2
        assert len(engine.generate(_requests(engine.tokenizer, 2), params)) == 2
    finally:
        engine.close()  # type: ignore[attr-defined]
    assert server.process.poll() is not None  # the server and its children are gone


def test_a_launched_sglang_server_serves_lora_adapters_synced_alone(tiny_model_dir: Path) -> None:
    """The server launched with sglang's LoRA (``rollout.sglang.lora``); an adapter-only sync is
    loaded by name and every generate names it: the log-probs served are the LoRA trainer's.
    Asleep, the next adapter waits for the wake-up."""
    engine = build_rollout_engine(
        "sglang",
        tiny_model_dir,
        seed=0,
        options={"launch_args": LAUNCH, "lora": {"max_rank": 8, "target_modules": "all"}},
    )
    server = engine._server  # type: ignore[attr-defined]
    try:
        trainer = build_training_engine(
            "torch", tiny_model_dir, ActorConfig(lr=1e-2, lora={"rank": 4, "alpha": 8.0}), 10, 1.0, seed=0
        )
        params = SamplingParams(1.0, 1.0, 6)
        for version in (1, 2):
            results = engine.generate(_requests(engine.tokenizer, 16), params)
            records = [
                {
                    "prompt_ids": r.prompt_ids,
                    "response_ids": r.response_ids,
                    "old_log_probs": r.log_probs,
                    "advantages": [1.0 if i % 2 else -1.0] * len(r.response_ids),
                }
                for i, r in enumerate(results)
            ]
            trainer.train_batch(
                collate(records, int(trainer.tokenizer.pad_token_id), ["old_log_probs", "advantages"]),
                build_actor_loss_fn(ActorConfig()),
            )
            sent = list(trainer.export_adapters())  # type: ignore[attr-defined]
            assert sent and all(".lora_A." in name or ".lora_B." in name for name, _ in sent)
            if version == 2:
                engine.sleep()
            engine.update_weights(iter(sent), version=version)
            if version == 2:
                engine.wake_up()
            assert engine.adapter.name is not None  # type: ignore[attr-defined]
            again = engine.generate(_requests(engine.tokenizer, 16), params)
            served = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in again]
            recomputed = scatter_response(
                trainer.compute_log_probs(collate(served, int(trainer.tokenizer.pad_token_id)))["log_probs"], served
            )
            for result, log_probs in zip(again, recomputed, strict=True):
                assert result.token_versions == [version] * len(result.log_probs)
                torch.testing.assert_close(torch.tensor(log_probs), torch.tensor(result.log_probs), atol=2e-3, rtol=0)
        staging = engine._staging_root  # type: ignore[attr-defined]
        assert [p.name for p in staging.glob("v*")] == [engine.adapter.name]  # type: ignore[attr-defined]
    finally:
        engine.close()  # type: ignore[attr-defined]
    assert server.process.poll() is not None
    assert not staging.exists()
