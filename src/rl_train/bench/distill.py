"""On-policy distillation against GRPO from scratch on the same student: time to reward.

For each seed, in one run of this script and on the same machine, ``rl-train train`` runs in a
fresh process, one after the other:

- **GRPO**: the demo config (``configs/arith-tiny.yaml``) as it ships, the built-in tiny policy
  learning from the rule reward alone;
- **distill**: ``configs/distill-tiny.yaml``, the same fresh student taught by a teacher (the
  demo's trained policy), its teacher pool started in the same process.

Each step line is stamped with the seconds since its process was launched (interpreter, Ray,
model loading and the teacher's start-up included), as in ``time_to_reward``. Printed per seed:
the steps and seconds to a 10-step mean *rule reward* of 0.9 on each side, and the ratio
distill / GRPO of those seconds; then the largest ratio over the seeds.

The teacher is ``--teacher`` (default ``runs/arith-tiny/policy``, what ``bash scripts/demo.sh``
saves); when it does not exist, the policy saved by this bench's first GRPO run is the teacher
(the same recipe, so the same kind of teacher), and the report says so.

    python -m rl_train.bench.distill                           # seeds 0 1 2
    python -m rl_train.bench.distill --seeds 0 --distill-args actor.policy_loss=forward_kl_topk teacher.top_k=8
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
    REPO,
    RL_TRAIN_STEP,
    TARGET,
    WINDOW,
    Curve,
    cell,
    prepare,
    rl_train_optimizer_steps,
    timed_run,
)

DISTILL_CONFIG = REPO / "configs" / "distill-tiny.yaml"
DEMO_TEACHER = "runs/arith-tiny/policy"
MAX_RATIO = 1 / 3
"""The target: distillation reaches 0.9 in at most a third of GRPO's time."""


def run_side(side: str, config: str, seed: int, overrides: list[str], workdir: Path, verbose: bool) -> Curve:
    every = [
        f"run.seed={seed}", f"run.name=distill-bench-{side}-{seed}", f"run.output_dir={workdir}",
        "trainer.val_before_train=false", "trainer.val_every_steps=0", "checkpoint.every_steps=0",
        *overrides,
    ]  # fmt: skip
    curve = Curve(side, seed, rl_train_optimizer_steps(config, every))
    command = [sys.executable, "-m", "rl_train.cli", "train", "--no-prefect", "--config", config, *every]
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    return timed_run(command, env, curve, RL_TRAIN_STEP, verbose)


def ratio(grpo: Curve, distill: Curve) -> tuple[str, float | None]:
    """distill / GRPO seconds to 0.9: exact, a bound ('<' GRPO never got there, '>' distillation
    never did) or none (neither did)."""
    g, d = grpo.summary()["seconds_to_target"], distill.summary()["seconds_to_target"]
    if g and d:
        return "=", d / g
    if d:
        return "<", d / grpo.total_seconds
    if g:
        return ">", distill.total_seconds / g
    return "?", None


def format_report(pairs: list[tuple[Curve, Curve]], teacher: str) -> str:
    lines = [
        f"teacher: {teacher}",
        f"seconds (from process start) and steps to a {WINDOW}-step mean rule reward of {TARGET}",
        "| seed | GRPO steps | GRPO s | distill steps | distill s | distill s per step | ratio distill / GRPO |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for grpo, distill in pairs:
        g, d = grpo.summary(), distill.summary()
        relation, value = ratio(grpo, distill)
        ratios.append(value)
        per_step = (distill.seconds[-1] - distill.seconds[0]) / (len(distill.seconds) - 1) if len(distill.seconds) > 1 else None
        shown = "n/a" if value is None else f"{'' if relation == '=' else relation}{value:.3f}"
        lines.append(
            f"| {grpo.seed} | {cell(g['steps_to_target'], 'd')} | {cell(g['seconds_to_target'])} "
            f"| {cell(d['steps_to_target'], 'd')} | {cell(d['seconds_to_target'])} | {cell(per_step, '.2f')} | {shown} |"
        )
    known = [r for r in ratios if r is not None]
    if known and len(known) == len(ratios):
        worst = max(known)
        verdict = "met" if worst <= MAX_RATIO else "not met"
        lines.append(f"largest ratio {worst:.3f} (target <= {MAX_RATIO:.3f}: {verdict})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--grpo-config", default=str(DEMO_CONFIG))
    parser.add_argument("--distill-config", default=str(DISTILL_CONFIG))
    parser.add_argument("--teacher", default=DEMO_TEACHER, help="the teacher's directory (the demo's saved policy)")
    parser.add_argument("--grpo-args", nargs="*", default=[], help="dotted overrides for the GRPO runs")
    parser.add_argument("--distill-args", nargs="*", default=[], help="dotted overrides for the distillation runs")
    parser.add_argument("--json", action="store_true", help="also print every curve as one JSON line")
    parser.add_argument("--verbose", action="store_true", help="echo the runs' output")
    args = parser.parse_args(argv)
    prepare(args.grpo_config)
    pairs: list[tuple[Curve, Curve]] = []
    with tempfile.TemporaryDirectory(prefix="rlt-distill-bench-") as tmp:
        workdir = Path(tmp)
        grpo_curves = []
        for seed in args.seeds:
            grpo_curves.append(run_side("grpo", args.grpo_config, seed, args.grpo_args, workdir, args.verbose))
            print(f"seed {seed} GRPO: {grpo_curves[-1].summary()['seconds_to_target']} s to {TARGET}", file=sys.stderr, flush=True)
        teacher = args.teacher
        if not Path(teacher).is_dir():
            teacher = str(workdir / f"distill-bench-grpo-{args.seeds[0]}" / "policy")
            print(f"{args.teacher} does not exist: the teacher is GRPO seed {args.seeds[0]}'s policy", file=sys.stderr)
        for seed, grpo in zip(args.seeds, grpo_curves, strict=True):
            overrides = [f"teacher.path={teacher}", *args.distill_args]
            distill = run_side("distill", args.distill_config, seed, overrides, workdir, args.verbose)
            pairs.append((grpo, distill))
            print(f"seed {seed} distill: {distill.summary()['seconds_to_target']} s to {TARGET}", file=sys.stderr, flush=True)
        label = teacher if teacher == args.teacher else f"GRPO seed {args.seeds[0]}'s policy ({args.teacher} missing)"
    print(format_report(pairs, label))
    if args.json:
        for grpo, distill in pairs:
            for curve in (grpo, distill):
                row: dict[str, Any] = {**curve.summary(), "rewards": curve.rewards, "seconds": curve.seconds}
                print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
