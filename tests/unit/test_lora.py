"""LoRA on the torch engine (``actor.lora``, engines/training/lora.py): only the adapters train,
an update equals PEFT's own, the reference is the base bit for bit, weight sync carries the
merged policy under its base names, checkpoints hold the adapters and resume bitwise, and the
saved adapter loads with ``peft``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.model.loading import load_model, load_policy
from rl_train.engines.model.response_decoder import load_response_decoder
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.lora_config import LoraSettings
from rl_train.engines.training.token_outputs import token_log_probs
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate, scatter_response

LORA = {"rank": 4, "alpha": 8.0}


def engine(model_dir: Path, lr: float = 1e-2, lora: dict | None = LORA, **actor: object) -> TorchTrainingEngine:
    cfg = ActorConfig(lr=lr, lora=lora, **actor)
    return TorchTrainingEngine(model_dir, cfg, horizon_steps=10, seed=0)


def batch(model_dir: Path, count: int = 12, seed: int = 1) -> dict[str, torch.Tensor]:
    """Sampled answers with a spread of advantages, pi_old a little off the policy."""
    rollout = build_rollout_engine("torch", model_dir, seed=seed)
    tok = rollout.tokenizer
    reqs = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i % 10}+{(3 * i) % 10}=", add_special_tokens=False)])
        for i in range(count)
    ]
    results = rollout.generate(reqs, SamplingParams(1.0, 1.0, 6, ignore_eos=True))
    records = [
        {
            "prompt_ids": r.prompt_ids,
            "response_ids": r.response_ids,
            "old_log_probs": [x - 0.05 for x in r.log_probs],
            "advantages": [((i % 5) - 2) / 2.0] * len(r.response_ids),
        }
        for i, r in enumerate(results)
    ]
    return collate(records, int(tok.pad_token_id), ["old_log_probs", "advantages"])


def adapters(trainer: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_only_the_adapters_train_and_hold_optimizer_state(tiny_model_dir: Path) -> None:
    trainer = engine(tiny_model_dir)
    trainable = adapters(trainer)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    total = sum(p.numel() for p in trainer.model.parameters())
    assert sum(t.numel() for t in trainable.values()) < total // 4
    trainer.train_batch(batch(tiny_model_dir), build_actor_loss_fn(ActorConfig()))
    state = trainer.optimizer.state
    assert len(state) == len(trainable)
    assert all(p.requires_grad for p in state)
    for name, param in trainer.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen[name]), name  # the base never moves
    assert any(not torch.equal(adapters(trainer)[n], t) for n, t in trainable.items() if ".lora_B." in n)


def test_a_lora_update_equals_peft_s_own_on_the_same_batch(tiny_model_dir: Path) -> None:
    """The engine's step against a PeftModel trained by hand: the loss over the whole batch,
    clip, AdamW. Only the order of float32 sums differs (micro-batching, fused Adam)."""
    from peft import LoraConfig, get_peft_model

    data = batch(tiny_model_dir)
    loss_fn = build_actor_loss_fn(ActorConfig())
    trainer = engine(tiny_model_dir, lr=1e-2, micro_batch_size=5)
    start = adapters(trainer)
    model = load_model(tiny_model_dir)
    targets = sorted({n.split(".")[-4] for n in start})
    reference = get_peft_model(model, LoraConfig(r=4, lora_alpha=8.0, target_modules=targets, lora_dropout=0.0))
    own = dict(reference.named_parameters())
    with torch.no_grad():
        for name, tensor in start.items():
            own[name].copy_(tensor)  # the same initial adapters
    trainable = [own[name] for name in start]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0, foreach=False)
    for _ in range(2):
        trainer.train_batch(data, loss_fn)
        positions = (data["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = reference(input_ids=data["input_ids"], position_ids=positions).logits
        numerator, denominator, _ = loss_fn({"log_probs": token_log_probs(logits, data["input_ids"], 1.0)}, data)
        optimizer.zero_grad()
        (numerator / denominator).backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
    # Adam divides each gradient by its own magnitude, which amplifies float32 noise on entries
    # whose gradient sits near its eps: those move by at most lr (as in test_engine_conformance's
    # micro-batch check). All but 1 in 1,000 entries within lr / 100, none beyond lr / 10; a wrong
    # scale, a lost micro-batch or a frozen adapter moves many entries by 2 lr.
    moved = off = total = 0
    for name, tensor in adapters(trainer).items():
        torch.testing.assert_close(tensor, own[name].detach(), atol=1e-3, rtol=0)
        off += int(((tensor - own[name].detach()).abs() > 1e-4).sum())
        total += tensor.numel()
        moved += int(not torch.equal(tensor, start[name]))
    assert off <= total // 1000, (off, total)
    assert moved == len(start)  # every adapter matrix moved (B from 0, A through B's gradient)


def test_the_reference_is_the_base_model_bit_for_bit(tiny_model_dir: Path) -> None:
    data = batch(tiny_model_dir)
    trainer = engine(tiny_model_dir)
    assert trainer.reference_is_base
    trainer.train_batch(data, build_actor_loss_fn(ActorConfig()))
    base = engine(tiny_model_dir, lora=None)
    assert not base.reference_is_base
    expected = base.compute_log_probs(data)["log_probs"]
    assert torch.equal(trainer.compute_log_probs(data, base=True)["log_probs"], expected)
    assert not torch.equal(trainer.compute_log_probs(data)["log_probs"], expected)  # the policy moved
    with pytest.raises(ValueError, match="this engine has none"):
        base.compute_log_probs(data, base=True)


def test_sync_sends_the_merged_policy_under_base_names_and_rollout_agrees(tiny_model_dir: Path) -> None:
    data = batch(tiny_model_dir)
    trainer = engine(tiny_model_dir)
    trainer.train_batch(data, build_actor_loss_fn(ActorConfig()))
    names = [name for name, _ in engine(tiny_model_dir, lora=None).export_weights()]
    exported = dict(trainer.export_weights())
    assert list(exported) == names
    rollout = build_rollout_engine("torch", tiny_model_dir, seed=3)
    rollout.update_weights(iter(exported.items()), version=1)
    tok = rollout.tokenizer
    reqs = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i}+{i}=", add_special_tokens=False)]) for i in range(16)
    ]
    results = rollout.generate(reqs, SamplingParams(1.0, 0.9, 6, ignore_eos=True))
    records = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in results]
    again = scatter_response(trainer.compute_log_probs(collate(records, int(tok.pad_token_id)))["log_probs"], records)
    for result, values in zip(results, again, strict=True):
        # merged (W + sBA) against unmerged (Wx + sB(Ax)): float32 sums in another order
        torch.testing.assert_close(torch.tensor(values), torch.tensor(result.log_probs), atol=1e-5, rtol=0)


def test_a_checkpoint_holds_the_adapters_and_resumes_bitwise(tiny_model_dir: Path) -> None:
    data, loss_fn = batch(tiny_model_dir), build_actor_loss_fn(ActorConfig())
    first = engine(tiny_model_dir)
    first.train_batch(data, loss_fn)
    state = copy.deepcopy(first.state_dict())  # as the worker's snapshot clones it
    assert "model" not in state and set(state["adapter"]) == set(adapters(first))  # type: ignore[arg-type]
    assert state["base"]["path"] == str(tiny_model_dir)  # type: ignore[index]
    second = engine(tiny_model_dir)
    second.load_state_dict(state)
    first.train_batch(data, loss_fn)
    second.train_batch(data, loss_fn)
    for name, tensor in adapters(first).items():
        assert torch.equal(tensor, adapters(second)[name]), name


def test_a_checkpoint_of_another_base_or_of_full_weights_is_refused(tiny_model_dir: Path) -> None:
    trainer = engine(tiny_model_dir)
    state = trainer.state_dict()
    state["base"] = {"path": "/elsewhere", "sha256": "0" * 64}
    with pytest.raises(ValueError, match="trained on the base model at /elsewhere"):
        trainer.load_state_dict(state)
    with pytest.raises(ValueError, match="holds full weights, not LoRA adapters"):
        trainer.load_state_dict(engine(tiny_model_dir, lora=None).state_dict())


def test_the_saved_policy_loads_merged_and_as_a_peft_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    data = batch(tiny_model_dir)
    trainer = engine(tiny_model_dir, lora={**LORA, "merged_export": True})
    trainer.train_batch(data, build_actor_loss_fn(ActorConfig()))
    expected = trainer.compute_log_probs(data)["log_probs"]
    trainer.save_pretrained(tmp_path / "policy")
    assert (tmp_path / "policy" / "config.json").is_file()  # the merged model, asked for
    config = (tmp_path / "policy" / "adapter" / "adapter_config.json").read_text()
    assert str(tiny_model_dir) in config  # the base it adapts
    positions = (data["attention_mask"].cumsum(-1) - 1).clamp(min=0)

    def log_probs(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=data["input_ids"], position_ids=positions).logits
        return token_log_probs(logits, data["input_ids"], 1.0) * data["attention_mask"]

    merged, _ = load_policy(tmp_path / "policy")
    adapted = PeftModel.from_pretrained(load_model(tiny_model_dir), str(tmp_path / "policy" / "adapter"))
    mask = data["attention_mask"].float()
    for model in (merged, adapted):
        torch.testing.assert_close(log_probs(model), expected * mask, atol=1e-5, rtol=0)


def test_an_adapter_saved_by_a_run_starts_another(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = engine(tiny_model_dir)
    trainer.train_batch(batch(tiny_model_dir), build_actor_loss_fn(ActorConfig()))
    trainer.save_pretrained(tmp_path / "policy")
    again = engine(tiny_model_dir, lora={"init_from": str(tmp_path / "policy" / "adapter")})
    assert adapters(again).keys() == adapters(trainer).keys()
    for name, tensor in adapters(trainer).items():
        assert torch.equal(adapters(again)[name], tensor)
    with pytest.raises(FileNotFoundError, match="is not a PEFT adapter directory"):
        engine(tiny_model_dir, lora={"init_from": str(tmp_path)})


def test_target_modules_that_match_nothing_are_refused_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"\['qkv'\] match no linear layer of the policy; its linear layers are named \[.*head is never adapted"):
        engine(tiny_model_dir, lora={"target_modules": ["q_proj", "qkv"]})
    only_q = engine(tiny_model_dir, lora={"target_modules": ["q_proj"]})
    assert all(".q_proj." in name for name in adapters(only_q))


@pytest.mark.parametrize(
    ("actor", "message"),
    [
        ({"engine": "megatron", "lora": {}}, "actor.engine 'megatron' has no LoRA here"),
        ({"lora": {"rank": 0}}, "greater than or equal to 1"),
        ({"lora": {"target_modules": []}}, "give module names"),
        ({"lora": {"target_modules": "everything"}}, "all-linear"),
    ],
)
def test_bad_lora_config_is_refused_at_load(actor: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ActorConfig.model_validate(actor)


def test_lora_with_fsdp_is_accepted() -> None:
    """actor.lora shards with actor.fsdp (the two-rank update, exports and checkpoint are in
    test_data_parallel.py)."""
    actor = ActorConfig.model_validate({"fsdp": True, "lora": {"rank": 4}})
    assert actor.fsdp and actor.lora is not None and actor.lora.rank == 4


def test_defaults() -> None:
    settings = LoraSettings()
    assert (settings.rank, settings.alpha, settings.dropout, settings.target_modules) == (8, 16.0, 0.0, "all-linear")


def test_an_adapter_folder_loads_as_its_base_with_the_adapter_merged(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``load_policy`` (so ``rl-train eval``'s and the rollout engines' loading) takes a PEFT
    adapter folder as the policy it trained; a folder whose base is gone is named."""
    import json

    data = batch(tiny_model_dir)
    trainer = engine(tiny_model_dir)
    trainer.train_batch(data, build_actor_loss_fn(ActorConfig()))
    trainer.save_pretrained(tmp_path / "policy")
    adapter = tmp_path / "policy" / "adapter"
    assert not (tmp_path / "policy" / "config.json").exists()  # no merged model unless asked for
    decoder = load_response_decoder(tmp_path / "policy")  # what evaluation reads answers with
    assert decoder.decode(trainer.tokenizer.encode("7", add_special_tokens=False)) == "7"
    expected = trainer.compute_log_probs(data)["log_probs"] * data["attention_mask"]
    positions = (data["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    for folder in (tmp_path / "policy", adapter):  # the run's policy/ holds the adapter alone
        model, tokenizer = load_policy(folder)
        assert tokenizer.pad_token_id == trainer.tokenizer.pad_token_id
        with torch.no_grad():
            logits = model(input_ids=data["input_ids"], position_ids=positions).logits
        got = token_log_probs(logits, data["input_ids"], 1.0) * data["attention_mask"]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    rollout = build_rollout_engine("torch", adapter, seed=0)
    tok = rollout.tokenizer
    out = rollout.generate([GenerationRequest("0", [tok.bos_token_id, *tok.encode("1+2=", add_special_tokens=False)])], SamplingParams(1.0, 1.0, 4))
    assert out[0].response_ids
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="is not a local model folder"):
        load_policy(adapter)
    (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")  # never unpickled
    with pytest.raises(ValueError, match="without adapter_model.safetensors"):
        load_policy(adapter)


def test_lora_with_router_replay_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="actor.lora with actor.router_replay 'r3'"):
        ActorConfig(lora={}, router_replay="r3", engine="megatron")
    with pytest.raises(ValidationError, match="actor.lora with actor.router_replay 'r2'"):
        ActorConfig(lora={}, router_replay="r2")
