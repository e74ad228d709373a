"""A minimal single-process GRPO loop in plain torch on the demo task: the baseline to beat.

No Ray, no Prefect, no queue: one process loads the demo's policy (``configs/arith-tiny.yaml``:
the built-in tiny Qwen2 at ``model.path``, created with the config's settings when missing) and
its task (``data.builtin_task`` rows from ``data.data_dir``, written when missing), then loops:
sample ``n`` answers to each of ``batch`` prompts at temperature 1, score them with the task's
reward function (``engines/reward/rules.py``, routed by ``data_source``), normalise the rewards
within each prompt's group (GRPO: (r - mean) / (unbiased std + 1e-6)), and take one AdamW
step on the policy gradient of that fresh batch. Each batch is used once, by the weights that
sampled it, so the importance ratio is exactly 1 and PPO's clip never acts: the loss is
``-advantage * log pi(token)``, aggregated over the response tokens (``--loss-agg``).

The model is the project's plain-torch Qwen2 (``engines/model/native.py``, held to
transformers' logits by ``tests/unit/test_native_model.py``): at this size its forward costs
what transformers' does (0.1 s for 1,024 sequences of 9 tokens, either), and it spares the
process the 1-2 s of importing transformers. Prompts are encoded as the rollout worker's
``encode_prompt`` does (BOS, then the text's tokens); the answer scored is the response up to
end of sequence, decoded without special tokens, as the reward worker scores it.

    python -m rl_train.bench.baseline_grpo                 # the tuned defaults
    python -m rl_train.bench.baseline_grpo --lr 1e-3 --batch 64 --n 16 --json

Prints each step's mean training reward, then: seconds from process start to the first step
done, the step and the seconds (from process start) at which the 10-step moving mean of the
training reward first reaches 0.9, and the plateau (mean of the last 10 steps). ``--json``
prints the summary as one JSON line on stdout (the step lines go to stderr);
``run_baseline(args)`` returns it.

The defaults are the best settings found for it, in a sweep of 10 settings recorded at a86aeb0
(``git show a86aeb0``); its newest figures are in ``bench/RESULTS.md`` (time_to_reward).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_train.startup_clock import since_start  # seconds since the process started (/proc), not the import

REPO = Path(__file__).resolve().parents[3]
DEMO_CONFIG = REPO / "configs" / "arith-tiny.yaml"
TARGET, WINDOW = 0.9, 10
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
ADV_EPSILON = 1e-6


@dataclass
class Rollout:
    """One batch of sampled answers, laid out as the training forward reads it."""

    sequences: torch.Tensor  # [B, P + T] left-padded prompt, then the response (pad after EOS)
    attention: torch.Tensor  # [B, P + T] 1 for real tokens
    prompt_width: int  # P
    response_mask: torch.Tensor  # [B, T] 1 for sampled tokens (EOS included)
    responses: list[list[int]]  # each answer's tokens before EOS


def load_task(config_path: str | Path, model_path: str | None, data_dir: str | None) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(policy, tokenizer, training rows) of the config's demo, created where missing."""
    from rl_train.config import load_config
    from rl_train.engines.model.native import load_native
    from rl_train.engines.model.tokenizer import load_tokenizer
    from rl_train.engines.reward.router import RewardRouter
    from rl_train.storage.dataset import load_prompts

    config = load_config(config_path)
    model_dir = Path(model_path or config.model.path)
    if not model_dir.exists():
        from rl_train.engines.model.tiny import create_tiny_policy

        print(f"creating the built-in tiny policy at {model_dir} ...", file=sys.stderr)
        create_tiny_policy(
            model_dir, seed=config.run.seed, pretrain_steps=config.model.pretrain_steps,
            prior_correct=config.model.pretrain_prior_correct, pretrain_task=config.model.pretrain_task,
        )  # fmt: skip
    folder = Path(data_dir or config.data.data_dir)
    train_file = folder / "train.parquet"
    if not train_file.exists() and config.data.builtin_task:
        from rl_train.storage.builtin_data import write_builtin_task

        write_builtin_task(config.data.builtin_task, folder, seed=config.run.seed)
    rows = load_prompts([train_file], check_data_source=RewardRouter(config.reward).route)
    return load_native(model_dir), load_tokenizer(model_dir), rows


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """BOS, then the prompt's tokens (as the rollout worker encodes a prompt)."""
    return [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompts: list[list[int]], n: int, max_new_tokens: int,
           temperature: float, generator: torch.Generator) -> Rollout:  # fmt: skip
    """``n`` answers to each prompt (rows grouped by prompt), decoded with a KV cache."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    contexts = [ids for ids in prompts for _ in range(n)]
    rows, width = len(contexts), max(len(ids) for ids in contexts)
    sequences = torch.full((rows, width + max_new_tokens), pad, dtype=torch.long)
    attention = torch.zeros_like(sequences)
    for i, ids in enumerate(contexts):
        sequences[i, width - len(ids) : width] = torch.tensor(ids)
        attention[i, width - len(ids) : width] = 1
    positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)
    done = torch.zeros(rows, dtype=torch.bool)
    cache = model.new_cache()
    step_ids = sequences[:, :width]
    for t in range(max_new_tokens):
        logits = model(step_ids, attention[:, : width + t], positions, cache=cache).logits[:, -1].float()
        tokens = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator).squeeze(-1)
        sequences[:, width + t] = tokens.masked_fill(done, pad)
        attention[:, width + t] = (~done).long()
        done |= tokens == eos
        if bool(done.all()):
            break
        step_ids, positions = sequences[:, width + t : width + t + 1], positions[:, -1:] + 1
    response_mask = attention[:, width:]
    responses = []
    for row, mask in zip(sequences[:, width:].tolist(), response_mask.tolist(), strict=True):
        kept = [token for token, real in zip(row, mask, strict=True) if real]
        responses.append(kept[: kept.index(eos)] if eos in kept else kept)
    return Rollout(sequences, attention, width, response_mask, responses)


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """[G, n] rewards -> [G, n] GRPO advantages: centred on the group mean, over its unbiased std."""
    return (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + ADV_EPSILON)


def response_log_probs(model: Any, rollout: Rollout, temperature: float, with_entropy: bool = False) -> Any:
    """[B, T] log-probs of the sampled response tokens under ``model`` (with grad); with
    ``with_entropy``, (log-probs, [B, T] entropy of each position's distribution)."""
    positions = (rollout.attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(rollout.sequences[:, :-1], rollout.attention[:, :-1], positions[:, :-1]).logits
    logits = logits[:, rollout.prompt_width - 1 :].float() / temperature
    targets = rollout.sequences[:, rollout.prompt_width :]
    all_log_probs = torch.log_softmax(logits, dim=-1)
    chosen = all_log_probs.gather(-1, targets[..., None]).squeeze(-1)
    if not with_entropy:
        return chosen
    return chosen, -(all_log_probs.exp() * all_log_probs).sum(-1)


def lr_factor(step: int, warmup: int, schedule: str, total: int, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then constant or cosine down to ``min_ratio`` at ``total``
    and ``min_ratio`` after it (step is 1-based)."""
    if warmup and step <= warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    progress = min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(ref - logp) - 1 - (ref - logp), >= 0."""
    delta = (ref_log_probs - log_probs).clamp(-10.0, 10.0)
    return (delta.exp() - 1.0 - delta).clamp(max=10.0)


def grpo_loss(log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, agg: str,
              ref_log_probs: torch.Tensor | None = None, kl_coef: float = 0.0,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0) -> torch.Tensor:  # fmt: skip
    """On-policy GRPO loss per token: -advantage * log-prob (+ kl_coef * KL to the reference,
    - entropy_coef * entropy), aggregated over the response tokens as ``agg`` says."""
    per_token = -advantages[:, None] * log_probs
    if ref_log_probs is not None and kl_coef > 0:
        per_token = per_token + kl_coef * low_var_kl(log_probs, ref_log_probs)
    if entropy is not None and entropy_coef > 0:
        per_token = per_token - entropy_coef * entropy
    per_token = per_token * mask
    if agg == "token-mean":  # every token of the batch weighs the same
        return per_token.sum() / mask.sum().clamp(min=1)
    if agg == "seq-mean-token-mean":  # every sequence weighs the same
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if agg == "seq-mean-token-sum":  # a sequence weighs its length
        return per_token.sum(-1).mean()
    raise ValueError(f"loss aggregation {agg!r}; allowed: {', '.join(LOSS_AGG_MODES)}")


def first_reaching(rewards: list[float], target: float = TARGET, window: int = WINDOW) -> int | None:
    """The first step (1-based) whose ``window``-step mean reward is at least ``target``."""
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window : end]) / window >= target:
            return end
    return None


def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """Train as the module docstring says; returns the summary (what ``--json`` prints)."""
    from rl_train.engines.reward.base import Trajectory
    from rl_train.engines.reward.router import RewardRouter

    router = RewardRouter()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
    torch.manual_seed(args.seed)
    rng, generator = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    model, tokenizer, rows = load_task(args.config, args.model, args.data_dir)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if args.kl_coef > 0 else None
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    log = sys.stderr if args.json else sys.stdout
    decay_steps = args.decay_steps or args.steps
    rewards_per_step: list[float] = []
    step_done_at: list[float] = []
    cpu_done_at: list[float] = []  # this process's CPU seconds: steadier than wall time on a busy machine
    for step in range(1, args.steps + 1):
        batch = rng.sample(rows, args.batch)
        rollout = sample(model, tokenizer, [encode_prompt(tokenizer, r["prompt"]) for r in batch],
                         args.n, args.max_new_tokens, args.temperature, generator)  # fmt: skip
        answers = [
            Trajectory.of_answer(row, tokenizer.decode(response, skip_special_tokens=True))
            for index, row in enumerate(batch)
            for response in rollout.responses[index * args.n : (index + 1) * args.n]
        ]
        scores = [result.score for result in router.score(answers)]
        rewards = torch.tensor(scores).view(args.batch, args.n)
        advantages = group_advantages(rewards).flatten()
        mask = rollout.response_mask.float()
        ref_log_probs = None
        if reference is not None:
            with torch.no_grad():
                ref_log_probs = response_log_probs(reference, rollout, args.temperature)
        entropy = None
        if args.entropy_coef > 0:
            log_probs, entropy = response_log_probs(model, rollout, args.temperature, with_entropy=True)
        else:
            log_probs = response_log_probs(model, rollout, args.temperature)
        loss = grpo_loss(log_probs, advantages, mask, args.loss_agg, ref_log_probs, args.kl_coef, entropy, args.entropy_coef)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.warmup, args.lr_schedule, decay_steps, args.min_lr_ratio)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip))
        optimizer.step()
        rewards_per_step.append(float(rewards.mean()))
        step_done_at.append(since_start())
        cpu_done_at.append(time.process_time())
        print(f"step {step:4d} | reward {rewards_per_step[-1]:.3f} | loss {loss.item():+.4f} | "
              f"grad_norm {grad_norm:.3f} | response_len {float(mask.sum(-1).mean()):.2f} | "
              f"t {step_done_at[-1]:.1f}s", file=log, flush=True)  # fmt: skip
    reached = first_reaching(rewards_per_step)
    tail = rewards_per_step[-WINDOW:]
    return {
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "n": args.n, "lr": args.lr,
        "loss_agg": args.loss_agg, "kl_coef": args.kl_coef, "warmup": args.warmup,
        "lr_schedule": args.lr_schedule, "decay_steps": decay_steps, "min_lr_ratio": args.min_lr_ratio, "entropy_coef": args.entropy_coef, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "model_impl": "native",
        "first_step_s": step_done_at[0] if step_done_at else None,
        "target": TARGET, "window": WINDOW,
        "steps_to_target": reached,
        "seconds_to_target": step_done_at[reached - 1] if reached else None,
        "cpu_seconds_to_target": cpu_done_at[reached - 1] if reached else None,
        "plateau": sum(tail) / len(tail) if tail else None,
        "total_s": since_start(),
        "rewards": rewards_per_step,
    }  # fmt: skip


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the closing lines a person reads."""
    reached = summary["steps_to_target"]
    to_target = (
        f"{summary['seconds_to_target']:.1f} s (from process start), {reached} optimizer steps"
        if reached else f"not reached in {summary['steps']} steps"
    )  # fmt: skip
    first = summary["first_step_s"]
    plateau = summary["plateau"]
    return "\n".join([
        f"first step done: {first:.2f} s from process start" if first is not None else "first step done: no step",
        f"{summary['window']}-step mean reward >= {summary['target']}: {to_target}",
        f"plateau (mean of the last {summary['window']} steps): {plateau:.3f}" if plateau is not None else "plateau: -",
    ])  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps (one per fresh batch)")
    parser.add_argument("--batch", type=int, default=16, help="prompts per step")
    parser.add_argument("--n", type=int, default=16, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW peak learning rate")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--loss-agg", choices=LOSS_AGG_MODES, default="token-mean")
    parser.add_argument("--kl-coef", type=float, default=0.02, help="k3 KL to the starting policy (0: none)")
    parser.add_argument("--warmup", type=int, default=5, help="linear lr warm-up steps")
    parser.add_argument("--lr-schedule", choices=("constant", "cosine"), default="cosine", help="after warm-up")
    parser.add_argument("--decay-steps", type=int, default=None, help="cosine: the steps it decays over (default: --steps); the lr stays at --min-lr-ratio after")
    parser.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine: the lr at the decay's end, over the peak")
    parser.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus (0: none)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--config", default=str(DEMO_CONFIG), help="where the model and data settings come from")
    parser.add_argument("--model", default=None, help="policy directory (default: the config's model.path)")
    parser.add_argument("--data-dir", default=None, help="task data directory (default: the config's data.data_dir)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line (steps to stderr)")
    args = parser.parse_args(argv)
    if args.decay_steps is not None and args.decay_steps < 1:
        parser.error(f"--decay-steps: got {args.decay_steps}; it must be 1 or more (or left out: --steps)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run_baseline(args)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
