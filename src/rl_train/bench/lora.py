"""LoRA against full fine-tuning on the same policy and batch: what each trains, holds and sends.

Each side runs in a fresh process of its own (peak memory is a process's high-water mark): it
builds the torch training engine on the policy (``actor.lora`` rank ``--rank`` on all linear
layers, or none), trains ``--steps`` steps on one batch of sampled answers, and reports:

- ``trainable``: parameters with gradients (and Adam's two moments);
- ``peak RSS``: the process's high-water resident memory once trained, over its resident
  memory before the engine was built (the imports, PEFT's included, and the batch are common
  to both sides);
- ``state``: bytes of the engine's checkpoint state (weights or adapters, optimizer);
- ``sync``: bytes the weight sync sends (``export_weights``): LoRA sends the merged weights
  today, so this ratio is 1 until adapter-only sync is built;
- ``export s`` and ``step s``: the medians of ``--steps`` exports and training steps.

The ratio column is LoRA over full, measured in this run.

    python -m rl_train.bench.lora                  # the built-in policy, rank 8
    python -m rl_train.bench.lora --rank 4 --steps 10 --model-dir models/tiny-qwen2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

FIGURES = ("trainable", "peak_rss_mb", "state_mb", "sync_mb", "export_s", "step_s")


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a nested state (dicts, lists, tensors, plain values)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return 0


def rss_mb() -> float:
    """This process's resident memory now (Linux /proc), MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 1e6


def measure_side(model_dir: str, rank: int, steps: int) -> dict[str, float]:
    """One side, in this process: ``rank`` 0 is full fine-tuning."""
    import torch

    from rl_train.algorithms.actor_loss import build_actor_loss_fn
    from rl_train.engines.training.config import ActorConfig
    from rl_train.engines.training.lora import require_peft
    from rl_train.engines.training.torch_engine import TorchTrainingEngine

    torch.set_num_threads(1)
    batch = sample_batch(model_dir)
    require_peft()  # both sides: PEFT's own import (tens of MB) is not the training's memory
    before = rss_mb()
    cfg = ActorConfig(lr=1e-3, lora={"rank": rank, "alpha": 2.0 * rank} if rank else None)
    engine = TorchTrainingEngine(model_dir, cfg, horizon_steps=steps, seed=0)
    loss_fn = build_actor_loss_fn(cfg)
    step_times, export_times, sync_bytes = [], [], 0
    for _ in range(steps):
        began = time.perf_counter()
        engine.train_batch(batch, loss_fn)
        step_times.append(time.perf_counter() - began)
        began = time.perf_counter()
        sync_bytes = sum(t.numel() * t.element_size() for _, t in engine.export_weights())
        export_times.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux
    return {
        "trainable": float(sum(p.numel() for p in engine.model.parameters() if p.requires_grad)),
        "peak_rss_mb": peak - before,
        "state_mb": tensor_bytes(engine.state_dict()) / 1e6,
        "sync_mb": sync_bytes / 1e6,
        "export_s": median(export_times),
        "step_s": median(step_times),
    }


def sample_batch(model_dir: str, count: int = 64) -> dict[str, Any]:
    """Answers of the policy to the task's kind of prompt, with advantages spread over them."""
    from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
    from rl_train.engines.rollout.registry import build_rollout_engine
    from rl_train.storage.records import collate

    rollout = build_rollout_engine("torch", model_dir, seed=1)
    tok = rollout.tokenizer
    reqs = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i % 10}+{(7 * i) % 10}=", add_special_tokens=False)])
        for i in range(count)
    ]
    results = rollout.generate(reqs, SamplingParams(1.0, 1.0, 8, ignore_eos=True))
    records = [
        {
            "prompt_ids": r.prompt_ids,
            "response_ids": r.response_ids,
            "old_log_probs": list(r.log_probs),
            "advantages": [((i % 5) - 2) / 2.0] * len(r.response_ids),
        }
        for i, r in enumerate(results)
    ]
    return collate(records, int(tok.pad_token_id), ["old_log_probs", "advantages"])


def run_side(model_dir: Path, rank: int, steps: int) -> dict[str, float]:
    """``measure_side`` in a fresh interpreter: its peak memory is its own."""
    out = subprocess.run(
        [sys.executable, "-m", "rl_train.bench.lora", "--side", str(rank), "--model-dir", str(model_dir), "--steps", str(steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(full: dict[str, float], lora: dict[str, float], rank: int) -> None:
    print(f"LoRA rank {rank} (all linear layers) against full fine-tuning, the same policy and batch")
    print(f"{'figure':<14}{'full':>14}{'lora':>14}{'ratio':>9}")
    for name in FIGURES:
        ratio = lora[name] / full[name] if full[name] else float("nan")
        print(f"{name:<14}{full[name]:>14.6g}{lora[name]:>14.6g}{ratio:>9.3f}")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rank", type=int, default=8, help="the adapters' rank")
    parser.add_argument("--steps", type=int, default=5, help="training steps (and exports) per side")
    parser.add_argument("--model-dir", type=Path, default=None, help="a policy (default: the built-in one, made now)")
    parser.add_argument("--side", type=int, default=None, help=argparse.SUPPRESS)  # one side, in its own process
    args = parser.parse_args(argv)
    if args.side is not None:
        print(json.dumps(measure_side(str(args.model_dir), args.side, args.steps)))
        return {}
    with tempfile.TemporaryDirectory(prefix="rlt-bench-lora-") as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from rl_train.engines.model.tiny import create_tiny_policy

            model_dir = create_tiny_policy(Path(tmp) / "model", seed=0, pretrain_steps=60)
        full = run_side(model_dir, 0, args.steps)
        lora = run_side(model_dir, args.rank, args.steps)
    report(full, lora, args.rank)
    return {"full": full, "lora": lora}


if __name__ == "__main__":
    main()
