"""Training tokens/s of the torch engine against the megatron-core engine, in one run.

Both engines get the same batches of the built-in policy (random token ids, right-padded,
``--rows`` x ``--length`` tokens, every response token counted) and make the same optimizer
steps with the same loss; each is timed over ``--steps`` steps after one warm-up step, and
the best of ``--repeats`` rounds is kept, the engines alternating so that drift on a busy
machine favours neither. Prints tokens/s for each and megatron / torch. The device is CUDA
when it is visible (megatron then runs its own CUDA paths), else the CPU (megatron behind its
CPU layer).

    python -m rl_train.bench.training_engines
    python -m rl_train.bench.training_engines --rows 64 --length 256 --model-dir PATH
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.protocol import TrainingEngine
from rl_train.engines.training.registry import build_training_engine
from rl_train.storage.records import collate

if TYPE_CHECKING:
    from rl_train.engines.training.megatron.engine import MegatronTrainingEngine
    from rl_train.engines.training.torch_engine import TorchTrainingEngine


def batch(rows: int, length: int, vocab: int, bos: int, pad: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    records = []
    for i in range(rows):
        prompt = torch.randint(3, vocab, (length // 4,), generator=generator).tolist()
        response = torch.randint(3, vocab, (length - length // 4 - 1 - i % 3,), generator=generator).tolist()
        records.append(
            {
                "prompt_ids": [bos, *prompt],
                "response_ids": response,
                "old_log_probs": [-2.0] * len(response),
                "advantages": [1.0 if i % 2 else -1.0] * len(response),
            }
        )
    return collate(records, pad, ["old_log_probs", "advantages"])


def seconds_per_step(engine: TrainingEngine, data: dict[str, torch.Tensor], steps: int) -> float:
    loss_fn = build_actor_loss_fn(ActorConfig())
    engine.train_batch(data, loss_fn)  # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        engine.train_batch(data, loss_fn)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def build_engines(model_dir: str) -> tuple[TorchTrainingEngine, MegatronTrainingEngine]:
    """Both engines over the policy at ``model_dir`` (the bench reads where each keeps it)."""
    from rl_train.engines.training.megatron.engine import MegatronTrainingEngine
    from rl_train.engines.training.torch_engine import TorchTrainingEngine

    torch_engine = build_training_engine("torch", model_dir, ActorConfig(engine="torch", lr=1e-5), 100)
    megatron_engine = build_training_engine("megatron", model_dir, ActorConfig(engine="megatron", lr=1e-5), 100)
    if not isinstance(torch_engine, TorchTrainingEngine) or not isinstance(megatron_engine, MegatronTrainingEngine):
        raise TypeError(f"the registry built {type(torch_engine)} and {type(megatron_engine)} for torch and megatron")
    return torch_engine, megatron_engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="an HF policy directory (default: the built-in tiny policy)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlt-bench-engines-") as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from rl_train.engines.model.tiny import create_tiny_policy

            model_dir = str(create_tiny_policy(Path(tmp) / "policy", seed=0, pretrain_steps=0))
        torch_engine, megatron_engine = build_engines(model_dir)
        engines: dict[str, TrainingEngine] = {"torch": torch_engine, "megatron": megatron_engine}
        devices = {  # the torch engine keeps the policy on the host for now; megatron takes CUDA when it can
            "torch": str(next(torch_engine.model.parameters()).device),
            "megatron": str(megatron_engine.device),
        }
        tokenizer = torch_engine.tokenizer
        vocab = int(torch_engine.model.config.vocab_size)
        data = batch(args.rows, args.length, vocab, int(tokenizer.bos_token_id), int(tokenizer.pad_token_id))
        tokens = float(data["response_mask"].sum())
        best = {name: float("inf") for name in engines}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                best[name] = min(best[name], seconds_per_step(engine, data, args.steps))
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"training tokens/s on {device}: {args.rows} rows x {args.length} tokens, {tokens:.0f} response tokens per step")
    for name, seconds in best.items():
        where = devices[name]
        print(f"  {name:<9} {tokens / seconds:>12.0f} tokens/s   {seconds * 1000:8.1f} ms/step   on {where}")
    print(f"  megatron / torch: {best['torch'] / best['megatron']:.2f}")


if __name__ == "__main__":
    main()
