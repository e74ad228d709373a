"""Adapter-only weight sync (``weight_sync/adapters.py``, ``rollout/lora_merge.py``): a LoRA
trainer sends each adapted layer's A and scaled B, nothing of the base; the built-in rollout
engine merges them into its weights (W0 kept) and ends on the very bits a merged full sync
gives it, over every backend, delta included; an engine that serves no adapters gets the
merged weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.registry import ROLLOUT_ENGINES, build_rollout_engine
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.lora_config import LoraSettings
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.engines.weight_sync.adapters import (
    adapter_names,
    merged_sync_note,
    sends_adapters,
    split_adapter_name,
)
from rl_train.engines.weight_sync.base import NamedTensors
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.local_link import LocalSyncLink
from rl_train.storage.records import collate, scatter_response

LORA = {"rank": 4, "alpha": 8.0}
PAIRS = [("naive", "shm"), ("bucketed", "shm"), ("bucketed", "tcp"), ("bucketed", "torch_dist"), ("bucketed", "mooncake"), ("delta", "shm"), ("delta", "tcp")]


def trainer(model_dir: Path, lora: dict[str, Any] | None = LORA) -> TorchTrainingEngine:
    return TorchTrainingEngine(model_dir, ActorConfig(lr=1e-2, lora=lora), horizon_steps=10, seed=0)


def rollout(model_dir: Path) -> TorchRolloutEngine:
    engine = build_rollout_engine("torch", model_dir, seed=3)
    assert isinstance(engine, TorchRolloutEngine)
    return engine


def sampled(engine: TorchRolloutEngine, count: int = 12) -> list[Any]:
    tok = engine.tokenizer
    requests = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i % 10}+{(7 * i) % 10}=", add_special_tokens=False)])
        for i in range(count)
    ]
    return engine.generate(requests, SamplingParams(1.0, 1.0, 5, ignore_eos=True))


def train_step(engine: TorchTrainingEngine, sampler: TorchRolloutEngine, seed: int) -> None:
    results = sampled(sampler)
    records = [
        {
            "prompt_ids": r.prompt_ids,
            "response_ids": r.response_ids,
            "old_log_probs": list(r.log_probs),
            "advantages": [((i + seed) % 5 - 2) / 2.0] * len(r.response_ids),
        }
        for i, r in enumerate(results)
    ]
    data = collate(records, int(sampler.tokenizer.pad_token_id), ["old_log_probs", "advantages"])
    engine.train_batch(data, build_actor_loss_fn(ActorConfig()))


def link(backend: str, transport: str, engine: Any) -> LocalSyncLink:
    cfg = WeightSyncConfig(backend=backend, transport=transport, bucket_size_bytes=4 << 10, timeout_seconds=30.0)
    return LocalSyncLink(cfg, engine)


def same_weights(a: TorchRolloutEngine, b: TorchRolloutEngine) -> list[str]:
    """The names whose tensors differ by a bit."""
    theirs = dict(b.export_weights())
    return [name for name, tensor in a.export_weights() if not torch.equal(tensor, theirs[name])]


def test_the_sync_carries_a_and_scaled_b_of_each_adapted_layer_and_nothing_else(tiny_model_dir: Path) -> None:
    engine = trainer(tiny_model_dir)
    sent = dict(engine.export_adapters())
    full = dict(trainer(tiny_model_dir, lora=None).export_weights())
    layers = {split_adapter_name(name)[0] for name in sent}  # type: ignore[index]
    assert layers and layers <= full.keys() and len(sent) == 2 * len(layers)
    for weight_name in layers:
        a_name, b_name = adapter_names(weight_name)
        out_features, in_features = full[weight_name].shape
        assert sent[a_name].shape == (LORA["rank"], in_features) and sent[b_name].shape == (out_features, LORA["rank"])
    sent_bytes = sum(t.numel() * t.element_size() for t in sent.values())
    assert sent_bytes < sum(t.numel() * t.element_size() for t in full.values()) / 4
    assert split_adapter_name("model.layers.0.self_attn.q_proj.weight") is None


@pytest.mark.parametrize(("backend", "transport"), PAIRS, ids=[f"{b}-{t}" for b, t in PAIRS])
def test_an_adapter_sync_ends_on_the_bits_of_a_merged_sync(tiny_model_dir: Path, backend: str, transport: str) -> None:
    engine, sampler = trainer(tiny_model_dir), rollout(tiny_model_dir)
    by_adapters, by_merge = rollout(tiny_model_dir), rollout(tiny_model_dir)
    sync = link(backend, transport, by_adapters)
    try:
        for version in (1, 2, 3):  # the first seeds a delta; the next are deltas of the adapters
            train_step(engine, sampler, seed=version)
            metrics = sync.sync(engine.export_adapters, version)
            by_merge.update_weights(engine.export_weights(), version)
            assert same_weights(by_adapters, by_merge) == []
            assert by_adapters.version == version
            sent = sum(t.numel() * t.element_size() for _, t in engine.export_adapters())
            assert 0 < metrics["weight_sync/bytes"] <= sent + 64 << 10  # framing at most
        assert by_adapters.adapters.adapted() == [split_adapter_name(n)[0] for n, _ in engine.export_adapters()][::2]  # type: ignore[index]
    finally:
        sync.close()


def test_the_rollout_s_log_probs_after_an_adapter_sync_equal_the_trainer_s(tiny_model_dir: Path) -> None:
    engine, served = trainer(tiny_model_dir), rollout(tiny_model_dir)
    train_step(engine, served, seed=1)
    served.update_weights(engine.export_adapters(), version=1)
    results = sampled(served, count=16)
    records = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in results]
    again = scatter_response(engine.compute_log_probs(collate(records, int(served.tokenizer.pad_token_id)))["log_probs"], records)
    for result, values in zip(results, again, strict=True):
        # merged (W0 + sBA) against PEFT's unmerged (W0 x + sB(A x)): float32 sums in another order
        torch.testing.assert_close(torch.tensor(values), torch.tensor(result.log_probs), atol=1e-5, rtol=0)


class WholeTensorsOnly:
    """A rollout engine that takes no sparse updates: a delta receiver keeps a mirror and hands
    it each changed tensor whole."""

    def __init__(self, engine: TorchRolloutEngine) -> None:
        self.engine = engine

    def abort(self) -> int:
        return self.engine.abort()

    def release_kv_cache(self) -> None:
        self.engine.release_kv_cache()

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def resume_kv_cache(self) -> None:
        self.engine.resume_kv_cache()


def test_a_delta_of_the_adapters_reaches_an_engine_that_loads_whole_tensors(tiny_model_dir: Path) -> None:
    engine, sampler = trainer(tiny_model_dir), rollout(tiny_model_dir)
    whole, by_merge = rollout(tiny_model_dir), rollout(tiny_model_dir)
    sync = link("delta", "shm", WholeTensorsOnly(whole))
    try:
        for version in (1, 2):
            train_step(engine, sampler, seed=version)
            sync.sync(engine.export_adapters, version)
            by_merge.update_weights(engine.export_weights(), version)
            assert same_weights(whole, by_merge) == []
    finally:
        sync.close()


def test_adapters_synced_while_asleep_are_served_after_wake_up(tiny_model_dir: Path) -> None:
    engine, served, by_merge = trainer(tiny_model_dir), rollout(tiny_model_dir), rollout(tiny_model_dir)
    train_step(engine, served, seed=1)
    served.sleep()
    served.update_weights(engine.export_adapters(), version=1)
    served.wake_up()
    by_merge.update_weights(engine.export_weights(), version=1)
    assert same_weights(served, by_merge) == []
    assert sampled(served)  # it generates


def test_a_full_weight_sent_to_an_adapted_layer_replaces_its_adapter(tiny_model_dir: Path) -> None:
    engine, served = trainer(tiny_model_dir), rollout(tiny_model_dir)
    train_step(engine, served, seed=1)
    served.update_weights(engine.export_adapters(), version=1)
    assert served.adapters.adapted()
    merged = dict(engine.export_weights())
    served.update_weights(iter(merged.items()), version=2)
    assert served.adapters.adapted() == []
    assert all(torch.equal(tensor, merged[name]) for name, tensor in served.export_weights())
    train_step(engine, served, seed=2)  # the next adapter merges onto what was sent
    served.update_weights(engine.export_adapters(), version=3)
    assert served.adapters.adapted()


def test_an_incomplete_or_misnamed_adapter_is_refused_by_name(tiny_model_dir: Path) -> None:
    engine, served = trainer(tiny_model_dir), rollout(tiny_model_dir)
    a_name, a = next(iter(engine.export_adapters()))
    with pytest.raises(KeyError, match="without \\['lora_B'\\]"):
        served.update_weights(iter([(a_name, a)]), version=1)
    with pytest.raises(KeyError, match="model.layers.99.mlp.up_proj.weight"):
        served.update_weights(iter([("model.layers.99.mlp.up_proj.lora_A.weight", a)]), version=1)


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_adapters_go_alone_only_to_an_engine_that_serves_them_else_merged_with_a_line(name: str) -> None:
    serves = ROLLOUT_ENGINES[name].loads_lora_adapters
    assert sends_adapters(LoraSettings(), name) is serves
    assert (merged_sync_note(LoraSettings(), name) is None) is serves
    assert sends_adapters(LoraSettings(sync="merged"), name) is False
    assert merged_sync_note(LoraSettings(sync="merged"), name) is None
    assert sends_adapters(None, name) is False and merged_sync_note(None, name) is None
    assert ROLLOUT_ENGINES["torch"].loads_lora_adapters


def test_an_engine_without_adapters_gets_the_merged_weights_and_the_run_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_train.engines.weight_sync import adapters

    monkeypatch.setattr(adapters, "loads_lora_adapters", lambda name: False)
    assert not adapters.sends_adapters(LoraSettings(), "torch")
    note = adapters.merged_sync_note(LoraSettings(), "torch")
    assert note is not None and "'torch' does not serve LoRA adapters" in note and "actor.lora.sync: merged" in note
