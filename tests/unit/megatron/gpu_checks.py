"""The megatron engine on a CUDA device against the torch engine on the host (one rank, its own
process: ``python gpu_checks.py MODEL_DIR``): megatron's CUDA paths (no CPU layer), NCCL as
its world. Prints one JSON line of measurements; ``test_megatron_gpu.py`` judges them."""

from __future__ import annotations

import copy
import json
import sys

import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.registry import build_training_engine
from rl_train.storage.records import collate


def main() -> None:
    folder = sys.argv[1]
    torch_engine = build_training_engine("torch", folder, ActorConfig(lr=1e-3), 10, 0.7, seed=0)
    megatron = build_training_engine("megatron", folder, ActorConfig(engine="megatron", lr=1e-3), 10, 0.7, seed=0)
    generator = torch.Generator().manual_seed(3)
    vocab = int(torch_engine.model.config.vocab_size)  # type: ignore[attr-defined]
    records = []
    for i in range(8):
        response = torch.randint(3, vocab, (4 + i,), generator=generator).tolist()
        records.append(
            {
                "prompt_ids": [1, *torch.randint(3, vocab, (3,), generator=generator).tolist()],
                "response_ids": response,
                "old_log_probs": [-2.0] * len(response),
                "advantages": [1.0 if i % 2 else -0.5] * len(response),
            }
        )
    data = collate(records, int(torch_engine.tokenizer.pad_token_id), ["old_log_probs", "advantages"])
    mask = data["attention_mask"].bool()
    want, got = torch_engine.compute_log_probs(data)["log_probs"], megatron.compute_log_probs(data)["log_probs"]
    loss_fn = build_actor_loss_fn(ActorConfig())
    expected, measured = torch_engine.train_batch(data, loss_fn), megatron.train_batch(data, loss_fn)
    saved = copy.deepcopy({k: v for k, v in megatron.state_dict().items()})
    again = build_training_engine("megatron", folder, ActorConfig(engine="megatron", lr=1e-3), 10, 0.7, seed=0)
    again.load_state_dict(saved)
    megatron.train_batch(data, loss_fn)
    again.train_batch(data, loss_fn)
    exported = dict(megatron.export_weights())
    reference = dict(torch_engine.export_weights())
    print(
        json.dumps(
            {
                "device": str(megatron.device),  # type: ignore[attr-defined]
                "log_prob_diff": (got - want)[mask].abs().max().item(),
                "loss_rel_diff": abs(measured["actor/loss"] - expected["actor/loss"]) / abs(expected["actor/loss"]),
                "grad_norm_rel_diff": abs(measured["actor/grad_norm"] - expected["actor/grad_norm"])
                / expected["actor/grad_norm"],
                "same_names": sorted(exported) == sorted(reference),
                "resumed_bit_exact": all(
                    torch.equal(a, b)
                    for (_, a), (_, b) in zip(megatron.export_weights(), again.export_weights(), strict=True)
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
