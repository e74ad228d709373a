"""LoRA against full fine-tuning on the same policy and batch: what each trains, holds and sends.

Each side runs in a fresh process of its own (peak memory is a process's high-water mark): it
builds the torch training engine on the policy (``actor.lora`` rank ``--rank`` on
``--targets``, or none), trains ``--steps`` steps on one batch of sampled answers, syncs its
weights after each step to a built-in rollout engine in the same process over ``--backend`` /
``--transport`` (as a run does: the adapters alone with LoRA, the full weights without), and
reports:

- ``trainable``: parameters with gradients (and Adam's two moments);
- ``peak RSS``: the process's high-water resident memory once trained, over its resident
  memory before the engines were built (the imports, PEFT's included, and the batch are
  common to both sides);
- ``state``: bytes of the engine's checkpoint state (weights or adapters, optimizer);
- ``sync``: bytes one weight sync moves (the backend's own count);
- ``sync s`` and ``step s``: the medians of ``--steps`` syncs (export, transport, load and,
  with LoRA, the merge into the rollout weights) and training steps.

The ratio column is LoRA over full, measured in this run. The LoRA side then times one
generation on its rollout engine three ways: merged into the weights on the engine's fast
path (as it serves), merged through the modules' own forward, and unmerged (W0 x + B A x on
every token, as forward hooks) through the same modules: what serving unmerged would cost.

    python -m rl_train.bench.lora                                  # the built-in policy, rank 8
    python -m rl_train.bench.lora --targets q_proj v_proj          # PEFT's usual attention pair
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

FIGURES = ("trainable", "peak_rss_mb", "state_mb", "sync_mb", "sync_s", "step_s")
GENERATION = ("generate_merged_fast_s", "generate_merged_s", "generate_unmerged_s")


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


def measure_side(
    model_dir: str,
    rank: int,
    steps: int,
    targets: list[str] | str = "all-linear",
    link: tuple[str, str] = ("bucketed", "shm"),
    repeats: int = 3,
    prompts: int = 256,
) -> dict[str, float]:
    """One side, in this process: ``rank`` 0 is full fine-tuning."""
    import torch

    from rl_train.algorithms.actor_loss import build_actor_loss_fn
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
    from rl_train.engines.training.config import ActorConfig
    from rl_train.engines.training.lora import require_peft
    from rl_train.engines.training.torch_engine import TorchTrainingEngine
    from rl_train.engines.weight_sync.config import WeightSyncConfig
    from rl_train.engines.weight_sync.local_link import LocalSyncLink

    torch.set_num_threads(1)
    batch = sample_batch(model_dir)
    require_peft()  # both sides: PEFT's own import (tens of MB) is not the training's memory
    before = rss_mb()
    lora = {"rank": rank, "alpha": 2.0 * rank, "target_modules": targets} if rank else None
    cfg = ActorConfig(lr=1e-3, lora=lora)
    engine = TorchTrainingEngine(model_dir, cfg, horizon_steps=steps, seed=0)
    served = TorchRolloutEngine(model_dir, seed=0)
    sync = LocalSyncLink(WeightSyncConfig(backend=link[0], transport=link[1]), served)
    export = engine.export_adapters if rank else engine.export_weights
    loss_fn = build_actor_loss_fn(cfg)
    step_times, sync_times, sync_bytes = [], [], 0.0
    try:
        for version in range(1, steps + 1):
            began = time.perf_counter()
            engine.train_batch(batch, loss_fn)
            step_times.append(time.perf_counter() - began)
            began = time.perf_counter()
            sync_bytes = sync.sync(export, version)["weight_sync/bytes"]
            sync_times.append(time.perf_counter() - began)
    finally:
        sync.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux
    figures = {
        "trainable": float(sum(p.numel() for p in engine.model.parameters() if p.requires_grad)),
        "peak_rss_mb": peak - before,
        "state_mb": tensor_bytes(engine.state_dict()) / 1e6,
        "sync_mb": sync_bytes / 1e6,
        "sync_s": median(sync_times),
        "step_s": median(step_times),
    }
    return {**figures, **(generation_times(served, repeats, prompts) if rank else {})}


def generation_times(served: Any, repeats: int = 3, prompts: int = 256) -> dict[str, float]:
    """One generation (``prompts`` prompts x 32 tokens) on ``served``, which holds merged adapters: on
    its fast path, through the modules' forward, and with the adapters unmerged (the base
    weights back, B A x added by forward hooks) through the same modules."""
    import torch

    from rl_train.engines.model.native import unfuse_projections
    from rl_train.engines.rollout.lora_merge import BASE
    from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams

    tok = served.tokenizer
    requests = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i % 10}+{(3 * i) % 10}=", add_special_tokens=False)])
        for i in range(prompts)
    ]

    def timed() -> float:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            served.generate(requests, SamplingParams(1.0, 1.0, 32, ignore_eos=True))
            times.append(time.perf_counter() - began)
        return median(times)

    figures = {"generate_merged_fast_s": timed()}
    unfuse_projections(served.model)
    served.fast_decode = False
    figures["generate_merged_s"] = timed()
    hooks = []
    with torch.no_grad():
        for module in served.model.modules():
            if BASE in module._buffers:
                module.weight.copy_(module._buffers[BASE])
                a, b = module._buffers["lora_A"], module._buffers["lora_B"]
                hooks.append(module.register_forward_hook(lambda _m, args, out, a=a, b=b: out + (args[0] @ a.T) @ b.T))
    figures["generate_unmerged_s"] = timed()
    for hook in hooks:
        hook.remove()
    return figures


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


def run_side(model_dir: Path, rank: int, args: argparse.Namespace) -> dict[str, float]:
    """``measure_side`` in a fresh interpreter: its peak memory is its own."""
    command = [
        sys.executable, "-m", "rl_train.bench.lora", "--side", str(rank), "--model-dir", str(model_dir),
        "--steps", str(args.steps), "--backend", args.backend, "--transport", args.transport, "--targets", *args.targets,
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(full: dict[str, float], lora: dict[str, float], args: argparse.Namespace) -> None:
    targets = " ".join(args.targets)
    print(f"LoRA rank {args.rank} ({targets}) against full fine-tuning, the same policy and batch; "
          f"sync by {args.backend} over {args.transport}")  # fmt: skip
    print(f"{'figure':<14}{'full':>14}{'lora':>14}{'ratio':>9}")
    for name in FIGURES:
        ratio = lora[name] / full[name] if full[name] else float("nan")
        print(f"{name:<14}{full[name]:>14.6g}{lora[name]:>14.6g}{ratio:>9.3f}")
    fast, merged, unmerged = (lora[name] for name in GENERATION)
    print(f"generation, LoRA side: merged on the fast path {fast:.3f} s; through the modules merged {merged:.3f} s, "
          f"unmerged {unmerged:.3f} s ({unmerged / merged:.2f}x merged)")  # fmt: skip


def targets_arg(values: list[str]) -> list[str] | str:
    return "all-linear" if values == ["all-linear"] else values


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rank", type=int, default=8, help="the adapters' rank")
    parser.add_argument("--targets", nargs="+", default=["all-linear"], help="actor.lora.target_modules")
    parser.add_argument("--steps", type=int, default=5, help="training steps (and syncs) per side")
    parser.add_argument("--backend", default="bucketed", help="rollout.weight_sync.backend of the syncs")
    parser.add_argument("--transport", default="shm", help="rollout.weight_sync.transport of the syncs")
    parser.add_argument("--model-dir", type=Path, default=None, help="a policy (default: the built-in one, made now)")
    parser.add_argument("--side", type=int, default=None, help=argparse.SUPPRESS)  # one side, in its own process
    args = parser.parse_args(argv)
    if args.side is not None:
        link = (args.backend, args.transport)
        print(json.dumps(measure_side(str(args.model_dir), args.side, args.steps, targets_arg(args.targets), link)))
        return {}
    with tempfile.TemporaryDirectory(prefix="rlt-bench-lora-") as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from rl_train.engines.model.tiny import create_tiny_policy

            model_dir = create_tiny_policy(Path(tmp) / "model", seed=0, pretrain_steps=60)
        full = run_side(model_dir, 0, args)
        lora = run_side(model_dir, args.rank, args)
    report(full, lora, args)
    return {"full": full, "lora": lora}


if __name__ == "__main__":
    main()
