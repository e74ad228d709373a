"""LoRA against full fine-tuning on the demo task: steps and seconds to a 10-step mean of 0.9.

For each seed, in one run of this script and on the same machine, ``rl-train train`` runs the
demo config twice, each in a fresh process: full fine-tuning as the demo ships, then LoRA
(``actor.lora.rank`` ``--rank`` on all linear layers, ``actor.lr`` ``--lora-lr``) for
``--lora-steps-factor`` times the demo's steps (the learning-rate schedule stretches with
them). Each step line is stamped with the seconds since its process started, as in
``time_to_reward`` (start-up included). Printed per side and seed: the steps and seconds to a
10-step mean training reward of 0.9, or the best 10-step mean where a run never gets there.

    python -m rl_train.bench.lora_learning                 # seeds 0 1 2, rank 8, lr 3e-3
    python -m rl_train.bench.lora_learning --seeds 0 --lora-args actor.lora.target_modules=[q_proj,v_proj]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rl_train.bench.time_to_reward import (
    DEMO_CONFIG,
    RL_TRAIN_STEP,
    TARGET,
    WINDOW,
    Curve,
    cell,
    prepare,
    rl_train_optimizer_steps,
    timed_run,
)


def best_mean(curve: Curve, window: int = WINDOW) -> float | None:
    """The highest ``window``-step mean reward of the run (None: fewer steps than the window)."""
    rewards = curve.rewards
    means = [sum(rewards[end - window : end]) / window for end in range(window, len(rewards) + 1)]
    return max(means) if means else None


def demo_steps(config: str) -> int:
    from rl_train.config import load_config

    return load_config(config).trainer.total_steps


def side_overrides(args: argparse.Namespace, lora: bool) -> list[str]:
    if not lora:
        return list(args.full_args)
    steps = demo_steps(args.config) * args.lora_steps_factor
    return [f"actor.lora.rank={args.rank}", f"actor.lr={args.lora_lr}", f"trainer.total_steps={steps}", *args.lora_args]


def run_side(seed: int, lora: bool, args: argparse.Namespace, workdir: Path) -> Curve:
    side = "lora" if lora else "full"
    overrides = [
        f"run.seed={seed}", f"run.name=lora-learning-{side}-{seed}", f"run.output_dir={workdir}",
        "trainer.val_before_train=false", "trainer.val_every_steps=0", "checkpoint.every_steps=0",
        *side_overrides(args, lora),
    ]  # fmt: skip
    curve = Curve(side, seed, rl_train_optimizer_steps(args.config, overrides))
    command = [sys.executable, "-m", "rl_train.cli", "train", "--no-prefect", "--config", args.config, *overrides]
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    return timed_run(command, env, curve, RL_TRAIN_STEP, args.verbose)


def summary(curve: Curve) -> dict[str, Any]:
    return {**curve.summary(), "best_mean": best_mean(curve)}


def format_report(curves: list[Curve]) -> str:
    lines = [
        f"steps and seconds (from process start) to a {WINDOW}-step mean training reward of {TARGET}",
        "| side | seed | steps run | steps to 0.9 | s to 0.9 | best 10-step mean | s per step | total s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for curve in curves:
        s = summary(curve)
        per_step = (curve.seconds[-1] - curve.seconds[0]) / (len(curve.seconds) - 1) if len(curve.seconds) > 1 else None
        lines.append(
            f"| {s['side']} | {s['seed']} | {s['steps']} | {cell(s['steps_to_target'], 'd')} "
            f"| {cell(s['seconds_to_target'])} | {cell(s['best_mean'], '.3f')} | {cell(per_step, '.2f')} "
            f"| {s['total_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(DEMO_CONFIG))
    parser.add_argument("--rank", type=int, default=8, help="the adapters' rank")
    parser.add_argument("--lora-lr", type=float, default=3e-3, help="actor.lr of the LoRA runs")
    parser.add_argument("--lora-steps-factor", type=int, default=3, help="LoRA runs this many times the demo's steps")
    parser.add_argument("--lora-args", nargs="*", default=[], help="more dotted overrides for the LoRA runs")
    parser.add_argument("--full-args", nargs="*", default=[], help="dotted overrides for the full runs")
    parser.add_argument("--json", action="store_true", help="also print every curve as one JSON line")
    parser.add_argument("--verbose", action="store_true", help="echo both sides' output")
    args = parser.parse_args(argv)
    prepare(args.config)
    curves = []
    with tempfile.TemporaryDirectory(prefix="rlt-lora-learning-") as tmp:
        for seed in args.seeds:
            for lora in (False, True):
                curve = run_side(seed, lora, args, Path(tmp))
                curves.append(curve)
                s = summary(curve)
                print(
                    f"seed {seed} {curve.side}: {s['steps_to_target']} steps, {s['seconds_to_target']} s to {TARGET}; "
                    f"best mean {s['best_mean']}",
                    file=sys.stderr,
                    flush=True,
                )
    print(format_report(curves))
    if args.json:
        for curve in curves:
            print(json.dumps({**summary(curve), "rewards": curve.rewards, "seconds": curve.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
