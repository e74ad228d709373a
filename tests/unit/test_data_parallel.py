"""1 vs 2 data-parallel ranks (gloo) give the same gradients (R-4.3), and with FSDP2 (``actor.fsdp``)
the same updates."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate

FIELDS = ["old_log_probs", "advantages"]


def _make_records(model_dir: Path) -> list[dict]:
    engine = TorchRolloutEngine(model_dir, seed=5)
    requests = [
        GenerationRequest(str(i), [1, *engine.tokenizer.encode(f"{i}+{i * 3}=", add_special_tokens=False)])
        for i in range(20)
    ]
    records = []
    for i, r in enumerate(engine.generate(requests, SamplingParams(1.0, 1.0, 6))):
        records.append(
            {
                "prompt_ids": r.prompt_ids,
                "response_ids": r.response_ids,
                "old_log_probs": [x - 0.03 for x in r.log_probs],
                "advantages": [(i % 4) - 1.5] * len(r.response_ids),
            }
        )
    return records


def _rank_main(rank: int, world: int, port: int, model_dir: str, shards: list[list[dict]], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean", micro_batch_size=3)
    engine = TorchTrainingEngine(model_dir, cfg, 10)
    engine.optimizer.zero_grad(set_to_none=True)
    metrics = engine.forward_backward_batch(collate(shards[rank], 0, FIELDS), build_actor_loss_fn(cfg), False)
    if rank == 0:
        grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}
        torch.save({"grads": grads, "loss": metrics["actor/loss"]}, out)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_match_one_rank(tiny_model_dir: Path, tmp_path: Path) -> None:
    records = _make_records(tiny_model_dir)
    # Uneven shards (7 vs 13 samples) exercise the global denominator.
    shards = [records[:7], records[7:]]
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank_main, args=(2, _free_port(), str(tiny_model_dir), shards, str(out)), nprocs=2, join=True)
    two = torch.load(out)

    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean")
    single = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    single.optimizer.zero_grad(set_to_none=True)
    metrics = single.forward_backward_batch(collate(records, 0, FIELDS), build_actor_loss_fn(cfg), False)
    assert abs(two["loss"] - metrics["actor/loss"]) < 1e-6
    for name, param in single.model.named_parameters():
        torch.testing.assert_close(two["grads"][name], param.grad, atol=1e-6, rtol=1e-5)


DISTILL = {"policy_loss": "distillation_ppo", "distill_term": "forward_kl_topk", "loss_agg_mode": "seq-mean-token-mean"}
TOPK = ["teacher_topk_ids", "teacher_topk_log_probs"]


def _with_teacher_top_k(records: list[dict], vocab: int) -> list[dict]:
    """The records with a teacher's top-4 on every response token (mass well below 1)."""
    generator = torch.Generator().manual_seed(3)
    out = []
    for record in records:
        length = len(record["response_ids"])
        ids = torch.stack([torch.randperm(vocab, generator=generator)[:4] for _ in range(length)])
        log_probs = (0.01 + 0.2 * torch.rand(length, 4, generator=generator)).log()
        out.append({**record, "teacher_topk_ids": ids.tolist(), "teacher_topk_log_probs": log_probs.tolist()})
    return out


def _distill_rank_main(rank: int, world: int, port: int, model_dir: str, shards: list[list[dict]], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = ActorConfig(**DISTILL, micro_batch_size=3)
    engine = TorchTrainingEngine(model_dir, cfg, 10)
    engine.optimizer.zero_grad(set_to_none=True)
    batch = collate(shards[rank], 0, FIELDS, TOPK)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), False)
    if rank == 0:
        grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}
        torch.save({"grads": grads, "loss": metrics["actor/loss"]}, out)
    dist.destroy_process_group()


def test_two_ranks_match_one_rank_with_a_top_k_distillation_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    """R-4.10 beside R-4.3: the forward KL over a teacher's top-k takes the global denominator too."""
    single = TorchTrainingEngine(tiny_model_dir, ActorConfig(**DISTILL), 10)
    records = _with_teacher_top_k(_make_records(tiny_model_dir), int(single.model.config.vocab_size))
    shards = [records[:7], records[7:]]
    out = tmp_path / "rank0.pt"
    mp.spawn(_distill_rank_main, args=(2, _free_port(), str(tiny_model_dir), shards, str(out)), nprocs=2, join=True)
    two = torch.load(out)

    single.optimizer.zero_grad(set_to_none=True)
    batch = collate(records, 0, FIELDS, TOPK)
    metrics = single.forward_backward_batch(batch, build_actor_loss_fn(ActorConfig(**DISTILL)), False)
    assert metrics["distill/forward_kl_topk"] > 0
    assert abs(two["loss"] - metrics["actor/loss"]) < 1e-6
    for name, param in single.model.named_parameters():
        torch.testing.assert_close(two["grads"][name], param.grad, atol=1e-6, rtol=1e-5)


def _fsdp_rank_main(rank: int, world: int, port: int, model_dir: str, shards: list[list[dict]], out: str) -> None:
    """Two updates on two FSDP2 ranks, then: the gathered weights, a state round trip on a
    fresh sharded engine (both make the same next update), and the saved policy."""
    import copy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean", micro_batch_size=3, lr=1e-3, fsdp=True)
    engine = TorchTrainingEngine(model_dir, cfg, 10)
    batch, loss_fn = collate(shards[rank], 0, FIELDS), build_actor_loss_fn(cfg)
    steps = [engine.train_batch(batch, loss_fn) for _ in range(2)]
    losses, norms = [m["actor/loss"] for m in steps], [m["actor/grad_norm"] for m in steps]
    weights = {name: tensor.clone() for name, tensor in engine.export_weights()}
    saved = copy.deepcopy(engine.state_dict())
    again = TorchTrainingEngine(model_dir, cfg, 10)
    again.load_state_dict(saved)
    engine.train_batch(batch, loss_fn)
    again.train_batch(batch, loss_fn)
    resumed = all(
        torch.equal(a, b) for (_, a), (_, b) in zip(engine.export_weights(), again.export_weights(), strict=True)
    )
    final = {name: tensor.clone() for name, tensor in engine.export_weights()}
    engine.save_pretrained(Path(out).with_name("policy"))
    if rank == 0:
        torch.save({"losses": losses, "norms": norms, "weights": weights, "resumed": resumed, "final": final}, out)
    dist.destroy_process_group()


def test_two_fsdp_ranks_make_the_one_rank_updates_and_checkpoint_their_shards(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """actor.fsdp: fully_shard's averaged gradients are scaled back to the global-denominator
    sum, so two sharded ranks on uneven halves make the unsharded one-rank update."""
    from transformers import AutoModelForCausalLM

    records = _make_records(tiny_model_dir)
    shards = [records[:7], records[7:]]
    out = tmp_path / "rank0.pt"
    mp.spawn(_fsdp_rank_main, args=(2, _free_port(), str(tiny_model_dir), shards, str(out)), nprocs=2, join=True)
    two = torch.load(out)
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean", lr=1e-3)
    single = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    batch, loss_fn = collate(records, 0, FIELDS), build_actor_loss_fn(cfg)
    steps = [single.train_batch(batch, loss_fn) for _ in range(2)]
    assert two["losses"] == pytest.approx([m["actor/loss"] for m in steps], rel=1e-5, abs=1e-6)
    # the gradient's scale shows in its norm (Adam's update all but hides it)
    assert two["norms"] == pytest.approx([m["actor/grad_norm"] for m in steps], rel=1e-4)
    # Adam's first steps move each weight by about lr = 1e-3 whatever its gradient's size, so the
    # few weights whose gradient is near Adam's eps turn summation-order noise into up to ~4e-5
    # of movement (2 of ~100k here): all but 1 in 10,000 within 1e-5, none beyond 10% of lr,
    # still tells a missed, doubled or mis-scheduled step from the one-rank update
    off, total = 0, 0
    for name, tensor in single.export_weights():
        torch.testing.assert_close(two["weights"][name], tensor, atol=1e-4, rtol=0)
        off += int(((two["weights"][name] - tensor).abs() > 1e-5).sum())
        total += tensor.numel()
    assert off <= total // 10_000
    assert two["resumed"]
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").state_dict()
    assert all(torch.equal(saved[name], tensor) for name, tensor in two["final"].items())


LORA = {"rank": 4, "alpha": 8.0, "merged_export": True}


def _fsdp_lora_rank_main(rank: int, world: int, port: int, model_dir: str, shards: list[list[dict]], out: str) -> None:
    """Two LoRA updates on two FSDP2 ranks, then what each reader of the sharded policy gives:
    the adapters, both exports, the reference (adapters off) beside the base model's own
    log-probs, pi_old pinned across a step, a state round trip, and the saved policy (rank 0
    saves while rank 1 joins as the trainer's other ranks do, with ``export_weights``)."""
    import copy

    from rl_train.engines.training.lora import adapter_parameters
    from rl_train.engines.training.sharding import full

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean", micro_batch_size=3, lr=1e-3, fsdp=True, lora=LORA)
    engine = TorchTrainingEngine(model_dir, cfg, 10)
    batch, loss_fn = collate(shards[rank], 0, FIELDS), build_actor_loss_fn(cfg)
    steps = [engine.train_batch(batch, loss_fn) for _ in range(2)]

    def gathered() -> dict[str, torch.Tensor]:
        return {name: full(param.detach()).clone() for name, param in adapter_parameters(engine.model)}

    report: dict[str, object] = {"losses": [m["actor/loss"] for m in steps], "norms": [m["actor/grad_norm"] for m in steps]}
    report["adapters"] = gathered()
    report["synced"] = {name: tensor.clone() for name, tensor in engine.export_adapters()}
    report["merged"] = {name: tensor.clone() for name, tensor in engine.export_weights()}
    base = TorchTrainingEngine(model_dir, ActorConfig(), 10)  # the base model, unsharded and without LoRA
    report["reference"] = torch.equal(
        engine.compute_log_probs(batch, base=True)["log_probs"], base.compute_log_probs(batch)["log_probs"]
    )
    engine.snapshot_pi_old()
    pinned = engine.compute_log_probs(batch)["log_probs"]
    saved = copy.deepcopy(engine.state_dict())
    again = TorchTrainingEngine(model_dir, cfg, 10)
    again.load_state_dict(saved)
    engine.train_batch(batch, loss_fn)
    again.train_batch(batch, loss_fn)
    report["pinned"] = torch.equal(engine.compute_log_probs(batch, pi_old=True)["log_probs"], pinned)
    report["moved"] = not torch.equal(engine.compute_log_probs(batch)["log_probs"], pinned)
    engine.clear_pi_old()
    report["resumed"] = all(
        torch.equal(a, b) for (_, a), (_, b) in zip(engine.export_adapters(), again.export_adapters(), strict=True)
    )
    report["final"] = gathered()
    report["final_merged"] = {name: tensor.clone() for name, tensor in engine.export_weights()}
    if rank == 0:
        engine.save_pretrained(Path(out).with_name("policy"))
        torch.save(report, out)
    else:
        for _ in engine.export_weights():  # the trainer's other ranks join a save this way
            pass
    dist.destroy_process_group()


def test_two_fsdp_ranks_make_the_one_rank_lora_update_and_export_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """actor.lora with actor.fsdp: fully_shard shards the frozen base beside the adapters and
    reduce-scatters the adapters' gradients alone; two ranks on uneven halves, accumulating over
    micro-batches of 3, make the one-rank update of the whole batch (the global denominator),
    and each reader of the sharded policy gathers what the one-rank engine reads."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_train.engines.model.loading import load_model

    records = _make_records(tiny_model_dir)
    shards = [records[:7], records[7:]]
    out = tmp_path / "rank0.pt"
    mp.spawn(_fsdp_lora_rank_main, args=(2, _free_port(), str(tiny_model_dir), shards, str(out)), nprocs=2, join=True)
    two = torch.load(out)
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-mean", lr=1e-3, lora=LORA)
    single = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    batch, loss_fn = collate(records, 0, FIELDS), build_actor_loss_fn(cfg)
    steps = [single.train_batch(batch, loss_fn) for _ in range(2)]
    assert two["losses"] == pytest.approx([m["actor/loss"] for m in steps], rel=1e-5, abs=1e-6)
    assert two["norms"] == pytest.approx([m["actor/grad_norm"] for m in steps], rel=1e-4)
    # as in the full-weight test: Adam turns summation-order noise on near-eps gradients into up
    # to ~lr / 10 of movement on a few entries; a missed, doubled or mis-scaled step moves ~lr
    own = {name: param.detach() for name, param in single.model.named_parameters() if param.requires_grad}
    assert two["adapters"].keys() == own.keys()
    off, total = 0, 0
    for name, tensor in own.items():
        torch.testing.assert_close(two["adapters"][name], tensor, atol=1e-4, rtol=0)
        off += int(((two["adapters"][name] - tensor).abs() > 1e-5).sum())
        total += tensor.numel()
    assert off <= total // 1000, (off, total)
    assert any(".lora_B." in name and bool(tensor.abs().sum()) for name, tensor in own.items())  # B left 0
    # the exports of the sharded policy are the one-rank engine's of the same adapters, bitwise
    with torch.no_grad():
        for name, param in single.model.named_parameters():
            if param.requires_grad:
                param.copy_(two["adapters"][name])
    for key, expected in (("synced", single.export_adapters()), ("merged", single.export_weights())):
        expected = dict(expected)
        assert list(two[key]) == list(expected), key
        assert all(torch.equal(two[key][name], tensor) for name, tensor in expected.items()), key
    assert two["reference"] and two["pinned"] and two["moved"] and two["resumed"]
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").state_dict()
    assert all(torch.equal(saved[name], tensor) for name, tensor in two["final_merged"].items())
    adapted = dict(PeftModel.from_pretrained(load_model(tiny_model_dir), str(tmp_path / "policy" / "adapter")).named_parameters())
    assert all(torch.equal(adapted[name], tensor) for name, tensor in two["final"].items())
