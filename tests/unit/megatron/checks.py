"""megatron-core on CPU against HF, run as one process per rank (each needs its own
torch.distributed world): ``python checks.py MODEL_DIR PORT RANK WORLD OUT_DIR``.

World 1: megatron's GPTModel gives HF's logits; its schedules give HF's log-probs (forward
only) and HF's gradients, the same for 1, 2 and 5 micro-batches; its distributed optimizer
makes HF + torch Adam's update. World 2: two tensor-parallel ranks give HF's logits and,
gathered, export HF's weights bit for bit; then, as
two data-parallel ranks with half the batch each, the update of world 1; then, as two
pipeline stages (p2p over gloo), HF's log-probs, each stage's share of HF's gradients, and
HF's weights gathered from both stages; then the training engine itself under each layout
(TP2, DP2, PP2) against the torch engine on one rank (``engine_layout``). Rank 0 prints one
JSON line of measurements; the tests in ``test_megatron_cpu.py`` judge them.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.export import export_hf_weights
from rl_train.engines.training.megatron.hf_bridge import (
    build_gpt_model,
    hf_to_megatron,
    shard_for_pipeline,
    shard_for_tensor_parallel,
    transformer_config,
)
from rl_train.engines.training.megatron.optimizer import optimizer_step, wrap_for_training, zero_grads
from rl_train.engines.training.megatron.schedule import (
    forward_backward,
    forward_log_probs,
    split_batch,
)
from rl_train.engines.training.registry import build_training_engine
from rl_train.engines.training.token_outputs import token_log_probs, token_topk_log_probs
from rl_train.storage.records import collate

SETTINGS = {"lr": 1e-3, "weight_decay": 0.0, "betas": (0.9, 0.999), "grad_clip": 1.0}
TEMPERATURE = 0.7


def batch(vocab: int) -> dict[str, torch.Tensor]:
    """Six right-padded rows of different lengths; the first 3 tokens of each are the prompt."""
    lengths = [10, 7, 9, 5, 8, 6]
    mask = torch.tensor([[1] * n + [0] * (10 - n) for n in lengths])
    ids = torch.randint(3, vocab, (len(lengths), 10), generator=torch.Generator().manual_seed(0)) * mask
    response = mask.clone()
    response[:, :3] = 0
    return {"input_ids": ids, "attention_mask": mask, "response_mask": response}


def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: dict[str, torch.Tensor]) -> tuple[Any, float, dict]:
    numerator = -(outputs["log_probs"] * micro_batch["response_mask"]).sum()
    return numerator, float(micro_batch["response_mask"].sum()), {}


def build(folder: str, hf_config: dict, tp_size: int, tp_rank: int) -> tuple[Any, Any]:
    from megatron.core import tensor_parallel

    with megatron_on_this_device():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        config = transformer_config(hf_config, tensor_model_parallel_size=tp_size)
        model = build_gpt_model(hf_config, config)
    whole = hf_to_megatron(load_file(f"{folder}/model.safetensors"), hf_config)
    missing, unexpected = model.load_state_dict(
        shard_for_tensor_parallel(whole, hf_config, tp_size, tp_rank), strict=False
    )
    assert not unexpected and all("_extra_state" in k for k in missing), (missing, unexpected)
    return model, config


def hf_reference(folder: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def hf_log_probs(reference: Any, data: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = data["attention_mask"]
    logits = reference(
        input_ids=data["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
    ).logits
    return token_log_probs(logits, data["input_ids"], TEMPERATURE)


def logits_diff(model: Any, hf_config: dict, reference: Any | None) -> float | None:
    ids = torch.randint(0, hf_config["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(9).unsqueeze(0).expand(3, -1)
    model.eval()
    with torch.no_grad(), megatron_on_this_device():
        got = model(ids, positions, attention_mask=None)[..., : hf_config["vocab_size"]]
    if reference is None:
        return None
    with torch.no_grad():
        want = reference.eval()(ids).logits
    return (got - want).abs().max().item()


def update(model: Any, config: Any, data: dict[str, torch.Tensor], rank: int, world: int) -> tuple[dict, dict]:
    """One optimizer step on this data-parallel rank's share of ``data``; (metrics, params)."""
    ddp, optimizer = wrap_for_training(model, config, SETTINGS)
    share = data["input_ids"].shape[0] // world
    mine = {k: v[rank * share : (rank + 1) * share] for k, v in data.items()}
    zero_grads(ddp, optimizer)
    _, denominator, _ = forward_backward(ddp, split_batch(mine, 2), loss_fn, TEMPERATURE)
    metrics = optimizer_step(ddp, optimizer, denominator)
    return metrics, {n.removeprefix("module."): p.detach().clone() for n, p in ddp.named_parameters()}


def one_rank(folder: str, hf_config: dict, out: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    model, config = build(folder, hf_config, 1, 0)
    reference = hf_reference(folder)
    result["logits_diff"] = logits_diff(model, hf_config, reference)

    data = batch(hf_config["vocab_size"])
    mask = data["attention_mask"]
    with torch.no_grad():
        want = hf_log_probs(reference.eval(), data)
    got = forward_log_probs(model, split_batch(data, 2), TEMPERATURE)["log_probs"]
    result["log_prob_diff"] = ((got - want).abs() * mask).max().item()

    reference.train()
    (-(hf_log_probs(reference, data) * data["response_mask"]).sum() / data["response_mask"].sum()).backward()
    want_grads = hf_to_megatron({n: p.grad for n, p in reference.named_parameters()}, hf_config)
    grads = {}
    for cut in (1, 2, 5):
        for param in model.parameters():
            param.grad = None
        _, denominator, _ = forward_backward(model, split_batch(data, cut), loss_fn, TEMPERATURE)
        grads[cut] = {n: p.grad / denominator for n, p in model.named_parameters()}
        result[f"denominator_{cut}"] = denominator
    result["grad_diff_vs_hf"] = max((grads[2][n] - want_grads[n]).abs().max().item() for n in want_grads)
    result["grad_diff_between_cuts"] = max(
        (grads[c][n] - grads[5][n]).abs().max().item() for c in (1, 2) for n in want_grads
    )

    result["hf_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0))
    adam = torch.optim.Adam(reference.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    adam.step()
    model, config = build(folder, hf_config, 1, 0)  # fresh weights, no grads left over
    metrics, params = update(model, config, data, 0, 1)
    result["metrics"] = metrics
    stepped = hf_to_megatron({n: p.detach() for n, p in reference.named_parameters()}, hf_config)
    result["param_diff_vs_hf"] = max((params[n] - stepped[n]).abs().max().item() for n in stepped)
    torch.save(params, f"{out}/megatron-1.pt")
    torch_reference(folder, out)
    result["distill_grad_diff_vs_hf"] = distillation_grad_diff(folder, hf_config, data)
    return result


def distillation_grad_diff(folder: str, hf_config: dict, data: dict[str, torch.Tensor]) -> float:
    """distillation_ppo with the top-k forward KL term (R-4.10) through the schedule, cut 1, 3
    and 6 ways, against HF's gradient of the same loss: the student's top-k log-probs come from
    the loss slot's logits, at the teacher's ids, aligned as the log-probs are."""
    generator = torch.Generator().manual_seed(2)
    rows, width = data["input_ids"].shape
    vocab = hf_config["vocab_size"]
    data = {
        **data,
        "old_log_probs": -2.0 - torch.rand(rows, width, generator=generator),
        "advantages": torch.randn(rows, width, generator=generator),
        "teacher_topk_ids": torch.randint(0, vocab, (rows, width, 4), generator=generator),
        "teacher_topk_log_probs": (0.01 + 0.2 * torch.rand(rows, width, 4, generator=generator)).log(),
    }
    loss = build_actor_loss_fn(ActorConfig(policy_loss="distillation_ppo", distill_term="forward_kl_topk"))
    reference = hf_reference(folder).train()
    mask = data["attention_mask"]
    logits = reference(
        input_ids=data["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
    ).logits
    outputs = {
        "log_probs": token_log_probs(logits, data["input_ids"], TEMPERATURE),
        "student_topk_log_probs": token_topk_log_probs(logits, data["teacher_topk_ids"], TEMPERATURE),
    }
    numerator, denominator, _ = loss(outputs, data)
    (numerator / denominator).backward()
    want = hf_to_megatron({n: p.grad for n, p in reference.named_parameters()}, hf_config)
    model, _ = build(folder, hf_config, 1, 0)
    diff = 0.0
    for cut in (1, 3, 6):
        for param in model.parameters():
            param.grad = None
        _, total, _ = forward_backward(model, split_batch(data, cut), loss, TEMPERATURE)
        got = {n: p.grad / total for n, p in model.named_parameters()}
        diff = max(diff, *((got[n] - want[n]).abs().max().item() for n in want))
    return diff


ENGINE_LR = 1e-3
ENGINE_STEPS = 2


def engine_batch(tokenizer: Any, vocab: int) -> dict[str, torch.Tensor]:
    """Eight trajectories of different lengths, as the trainer collates them (right-padded)."""
    generator = torch.Generator().manual_seed(2)
    records = []
    for i in range(8):
        prompt = torch.randint(3, vocab, (2 + i % 3,), generator=generator).tolist()
        response = torch.randint(3, vocab, (3 + (5 * i) % 7,), generator=generator).tolist()
        records.append(
            {
                "prompt_ids": [tokenizer.bos_token_id, *prompt],
                "response_ids": response,
                "old_log_probs": [-2.0] * len(response),
                "advantages": [((i % 5) - 2) / 2.0] * len(response),
            }
        )
    return collate(records, int(tokenizer.pad_token_id), ["old_log_probs", "advantages"])


def torch_reference(folder: str, out: str) -> None:
    """The torch engine (one rank) on the engine checks' batch: what every megatron layout must match."""
    engine = build_training_engine("torch", folder, ActorConfig(lr=ENGINE_LR), 10, TEMPERATURE, seed=0)
    data = engine_batch(engine.tokenizer, engine.model.config.vocab_size)
    reference: dict[str, Any] = {"batch": data, "log_probs": engine.compute_log_probs(data)["log_probs"]}
    steps = [engine.train_batch(data, build_actor_loss_fn(ActorConfig())) for _ in range(ENGINE_STEPS)]
    reference["loss"] = torch.tensor([m["actor/loss"] for m in steps])
    reference["grad_norm"] = torch.tensor([m["actor/grad_norm"] for m in steps])
    reference["weights"] = dict(engine.export_weights())
    torch.save(reference, f"{out}/torch-reference.pt")


def engine_layout(folder: str, rank: int, layout: dict[str, int], out: str) -> dict[str, Any]:
    """The megatron engine under ``layout`` (two ranks) against the torch engine's one rank:
    log-probs, the losses, grad norms and weights of two updates (each data-parallel rank
    training on its half of the batch), the pinned pi_old, every rank exporting the same
    weights, and a state round trip that makes the same next update bit for bit."""
    reference = torch.load(f"{out}/torch-reference.pt")
    cfg = ActorConfig(engine="megatron", lr=ENGINE_LR, num_ranks=2, megatron=layout)
    engine = build_training_engine("megatron", folder, cfg, 10, TEMPERATURE, seed=0)
    data = reference["batch"]
    rows = slice(None) if engine.dp_size == 1 else slice(engine.dp_rank, None, engine.dp_size)
    mine = {key: value[rows] for key, value in data.items()}
    result: dict[str, Any] = {}
    mask = mine["attention_mask"].bool()
    got = engine.compute_log_probs(mine)["log_probs"]
    result["log_prob_diff"] = (got - reference["log_probs"][rows])[mask].abs().max().item()
    before = got
    engine.snapshot_pi_old()
    loss_fn = build_actor_loss_fn(ActorConfig())
    metrics = [engine.train_batch(mine, loss_fn) for _ in range(ENGINE_STEPS)]
    result["loss_rel_diff"] = max(
        abs(m["actor/loss"] - float(want)) / abs(float(want)) for m, want in zip(metrics, reference["loss"], strict=True)
    )
    result["grad_norm_rel_diff"] = max(
        abs(m["actor/grad_norm"] - float(want)) / float(want)
        for m, want in zip(metrics, reference["grad_norm"], strict=True)
    )
    result["pi_old_bit_exact"] = torch.equal(engine.compute_log_probs(mine, pi_old=True)["log_probs"], before)
    engine.clear_pi_old()
    exported = dict(engine.export_weights())
    result["weight_diff"] = max((exported[n] - t).abs().max().item() for n, t in reference["weights"].items())
    flat = torch.cat([exported[n].reshape(-1) for n in sorted(exported)])
    others = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(others, flat)
    result["ranks_export_the_same"] = all(torch.equal(other, flat) for other in others)
    saved = copy.deepcopy(engine.state_dict())
    again = build_training_engine("megatron", folder, cfg, 10, TEMPERATURE, seed=0)
    again.load_state_dict(saved)
    engine.train_batch(mine, loss_fn)
    again.train_batch(mine, loss_fn)
    result["resumed_bit_exact"] = all(
        torch.equal(a, b) for (_, a), (_, b) in zip(engine.export_weights(), again.export_weights(), strict=True)
    )
    return result


def two_ranks(folder: str, hf_config: dict, rank: int, out: str) -> dict[str, Any]:
    from megatron.core import parallel_state

    result: dict[str, Any] = {}
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model, _ = build(folder, hf_config, 2, rank)
    result["tp_logits_diff"] = logits_diff(model, hf_config, hf_reference(folder) if rank == 0 else None)
    exported, saved = export_hf_weights(model, hf_config), load_file(f"{folder}/model.safetensors")
    result["tp_export_bit_exact"] = exported.keys() == saved.keys() and all(
        exported[k].equal(saved[k]) for k in saved
    )
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)  # two data-parallel ranks
    model, config = build(folder, hf_config, 1, 0)
    metrics, params = update(model, config, batch(hf_config["vocab_size"]), rank, 2)
    result["metrics"] = metrics
    if rank == 0:
        torch.save(params, f"{out}/megatron-2.pt")
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)  # two pipeline stages
    with open(f"{out}/pp-stage-{rank}.json", "w") as handle:  # files, not pickled objects on the wire
        json.dump(pipeline_stage(folder, hf_config, rank), handle)
    dist.barrier()
    for stage in range(2):
        with open(f"{out}/pp-stage-{stage}.json") as handle:
            result.update(json.load(handle))
    parallel_state.destroy_model_parallel()

    for name, layout in ENGINE_LAYOUTS.items():  # the engine itself sets megatron's groups up
        checks = engine_layout(folder, rank, layout, out)
        parallel_state.destroy_model_parallel()
        gathered: list[Any] = [None, None]
        with open(f"{out}/engine-{name}-{rank}.json", "w") as handle:
            json.dump(checks, handle)
        dist.barrier()
        for other in range(2):
            with open(f"{out}/engine-{name}-{other}.json") as handle:
                gathered[other] = json.load(handle)
        result[f"engine_{name}"] = gathered
    return result


ENGINE_LAYOUTS = {
    "tp2": {"tensor_parallel_size": 2},
    "dp2": {},
    "pp2": {"pipeline_parallel_size": 2},
}


def pipeline_stage(folder: str, hf_config: dict, rank: int) -> dict[str, Any]:
    """This stage's measurements: the log-probs (last stage) and its layers' gradients."""
    from megatron.core import tensor_parallel

    first, last = rank == 0, rank == 1
    with megatron_on_this_device():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        config = transformer_config(hf_config, pipeline_model_parallel_size=2)
        model = build_gpt_model(hf_config, config, pre_process=first, post_process=last)
    whole = hf_to_megatron(load_file(f"{folder}/model.safetensors"), hf_config)
    missing, unexpected = model.load_state_dict(shard_for_pipeline(whole, hf_config, 2, rank), strict=False)
    assert not unexpected and all("_extra_state" in k for k in missing), (missing, unexpected)
    data = batch(hf_config["vocab_size"])
    reference = hf_reference(folder)
    out: dict[str, Any] = {}
    got = forward_log_probs(model, split_batch(data, 2), TEMPERATURE)
    if last:
        assert got is not None
        got = got["log_probs"]
        with torch.no_grad():
            want = hf_log_probs(reference.eval(), data)
        out["pp_log_prob_diff"] = ((got - want).abs() * data["attention_mask"]).max().item()
    reference.train()
    (-(hf_log_probs(reference, data) * data["response_mask"]).sum() / data["response_mask"].sum()).backward()
    hf_grads = hf_to_megatron({n: p.grad for n, p in reference.named_parameters()}, hf_config)
    want_grads = shard_for_pipeline(hf_grads, hf_config, 2, rank)
    for param in model.parameters():
        param.grad = None
    forward_backward(model, split_batch(data, 2), loss_fn, TEMPERATURE)
    exported, saved = export_hf_weights(model, hf_config), load_file(f"{folder}/model.safetensors")
    out[f"pp_export_bit_exact_stage_{rank}"] = exported.keys() == saved.keys() and all(
        exported[k].equal(saved[k]) for k in saved
    )
    denominator = float(data["response_mask"].sum())
    layers = [n for n, _ in model.named_parameters() if n.startswith("decoder.")]
    grads = dict(model.named_parameters())
    out[f"pp_grad_diff_stage_{rank}"] = max(
        (grads[n].grad / denominator - want_grads[n]).abs().max().item() for n in layers
    )
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    folder, port, rank, world, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    with open(f"{folder}/config.json") as handle:
        hf_config = json.load(handle)
    if world == 1:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(1, 1)
        result = one_rank(folder, hf_config, out)
    else:
        result = two_ranks(folder, hf_config, rank, out)
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
