"""Time to reward: the single-process GRPO baseline against ``rl-train train``, seed by seed.

For each seed, in one run of this script and on the same machine, the baseline
(``bench/baseline_grpo.py``: plain torch, one process, fully on-policy) and ``rl-train train``
on the demo config (through Prefect's local API and local Ray, as a user runs it) are each
started as a fresh process, one after the other. Both are timed the same way: each step line
the process prints is stamped with the seconds since the bench launched it, so start-up
(interpreter, imports, Ray, Prefect, model and data loading) is included on both sides.

Printed for each side and seed:

- seconds from process start to the first step done;
- seconds, global steps and optimizer steps to a 10-step mean training reward of 0.9;
- the plateau (mean of the last 10 steps) and the lowest 10-step mean after 0.9 was first
  reached (whether it held);

then the ratio rl-train / baseline of the time to 0.9 per seed, and their median. Where only
one side reaches 0.9, the ratio is a bound taken with the other side's whole run (``< x``
when the baseline never reaches it, ``> x`` when rl-train does not). The policy
and data are the demo's (made once beforehand by the first run that needs them, not timed:
the bench creates them before any timed run).

    python -m rl_train.bench.time_to_reward                       # seeds 0 1 2
    python -m rl_train.bench.time_to_reward --seeds 3 4 --no-prefect
    python -m rl_train.bench.time_to_reward --rl-train-args actor.lr=2e-3 --baseline-args --lr 3e-3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[3]
DEMO_CONFIG = REPO / "configs" / "arith-tiny.yaml"
TARGET, WINDOW = 0.9, 10
RL_TRAIN_STEP = re.compile(r"^step\s+(\d+)/\d+ \| reward ([0-9.]+)")
BASELINE_STEP = re.compile(r"^step\s+(\d+) \| reward ([0-9.]+)")


@dataclass
class Curve:
    """One process's step lines: the reward of each step and when its line arrived."""

    side: str
    seed: int
    optimizer_steps_per_step: int
    rewards: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    """Seconds from the process's launch to each step line."""
    total_seconds: float = 0.0

    def first_reaching(self, target: float = TARGET, window: int = WINDOW) -> int | None:
        """The first step (1-based) whose ``window``-step mean reward is at least ``target``."""
        for end in range(window, len(self.rewards) + 1):
            if sum(self.rewards[end - window : end]) / window >= target:
                return end
        return None

    def summary(self) -> dict[str, Any]:
        reached = self.first_reaching()
        means = [sum(self.rewards[e - WINDOW : e]) / WINDOW for e in range(WINDOW, len(self.rewards) + 1)]
        tail = self.rewards[-WINDOW:]
        return {
            "side": self.side,
            "seed": self.seed,
            "first_step_s": self.seconds[0] if self.seconds else None,
            "steps": len(self.rewards),
            "steps_to_target": reached,
            "optimizer_steps_to_target": reached * self.optimizer_steps_per_step if reached else None,
            "seconds_to_target": self.seconds[reached - 1] if reached else None,
            "plateau": sum(tail) / len(tail) if tail else None,
            "lowest_mean_after_target": min(means[reached - WINDOW :]) if reached else None,
            "total_s": self.total_seconds,
        }


def read_steps(stream: IO[str], pattern: re.Pattern[str], curve: Curve, started: float, echo: bool) -> None:
    for line in stream:
        found = pattern.match(line)
        if found:
            curve.rewards.append(float(found.group(2)))
            curve.seconds.append(time.perf_counter() - started)
        if echo:
            print(f"  [{curve.side} seed {curve.seed}] {line.rstrip()}", file=sys.stderr, flush=True)


def timed_run(command: list[str], env: dict[str, str], curve: Curve, pattern: re.Pattern[str], echo: bool) -> Curve:
    """Run ``command``; stamp each of its step lines (stdout or stderr) as it arrives."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    assert process.stdout is not None and process.stderr is not None
    readers = [
        threading.Thread(target=read_steps, args=(stream, pattern, curve, started, echo), daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    code = process.wait()
    curve.total_seconds = time.perf_counter() - started
    for reader in readers:
        reader.join()
    if code != 0:
        raise RuntimeError(f"{curve.side} (seed {curve.seed}) exited with {code}: {' '.join(command)}")
    return curve


def rl_train_optimizer_steps(config: str, overrides: list[str]) -> int:
    """Optimizer steps per global step of the resolved config."""
    from rl_train.config import load_config

    cfg = load_config(config, overrides)
    groups = cfg.trainer.train_batch_size // cfg.trainer.parameter_sync_step
    mini = cfg.actor.ppo_mini_batch_size or groups
    return cfg.trainer.parameter_sync_step * cfg.actor.ppo_epochs * -(-groups // mini)


def prepare(config: str) -> None:
    """The demo's policy and data, made before any timed run (as a user's second run finds them)."""
    from rl_train.config import load_config
    from rl_train.flows.base import prepare_inputs

    prepare_inputs(load_config(config))


def run_seed(seed: int, args: argparse.Namespace, workdir: Path) -> tuple[Curve, Curve]:
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    baseline = Curve("baseline", seed, 1)
    timed_run(
        [sys.executable, "-m", "rl_train.bench.baseline_grpo", "--seed", str(seed), "--config", args.config,
         *args.baseline_args],
        env, baseline, BASELINE_STEP, args.verbose,
    )  # fmt: skip
    overrides = [
        f"run.seed={seed}", f"run.name=ttr-seed{seed}", f"run.output_dir={workdir}",
        "trainer.val_before_train=false", "trainer.val_every_steps=0", "checkpoint.every_steps=0",
        *args.rl_train_args,
    ]  # fmt: skip
    rl_train = Curve("rl-train", seed, rl_train_optimizer_steps(args.config, overrides))
    command = [sys.executable, "-m", "rl_train.cli", "train", "--config", args.config, *overrides]
    if args.no_prefect:
        command.insert(4, "--no-prefect")
    timed_run(command, env, rl_train, RL_TRAIN_STEP, args.verbose)
    return baseline, rl_train


def seed_ratio(baseline: Curve, rl_train: Curve) -> tuple[str, float | None]:
    """rl-train's time to the target over the baseline's, as (relation, value): ``=`` when both
    reached it; ``<`` when only rl-train did (the baseline would have needed more than its whole
    run, so the ratio is below rl-train's time over that run's length); ``>`` when only the
    baseline did (likewise, above); ``-`` (None) when neither did."""
    b, r = baseline.summary()["seconds_to_target"], rl_train.summary()["seconds_to_target"]
    if b and r:
        return "=", r / b
    if r and baseline.total_seconds:
        return "<", r / baseline.total_seconds
    if b and rl_train.total_seconds:
        return ">", rl_train.total_seconds / b
    return "-", None


def cell(value: Any, spec: str = ".1f") -> str:
    """A table cell: ``value`` formatted, or ``-`` where there is none."""
    return "-" if value is None else format(value, spec)


def format_report(pairs: list[tuple[Curve, Curve]]) -> str:
    lines = [
        f"time to a {WINDOW}-step mean training reward of {TARGET}, seconds from process start",
        "| side | seed | first step s | s to 0.9 | steps to 0.9 | optimizer steps to 0.9 | plateau | lowest mean after | total s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for baseline, rl_train in pairs:
        for curve in (baseline, rl_train):
            s = curve.summary()
            lines.append(
                f"| {s['side']} | {s['seed']} | {cell(s['first_step_s'], '.2f')} | {cell(s['seconds_to_target'])} "
                f"| {cell(s['steps_to_target'], 'd')} | {cell(s['optimizer_steps_to_target'], 'd')} "
                f"| {cell(s['plateau'], '.3f')} | {cell(s['lowest_mean_after_target'], '.3f')} | {s['total_s']:.1f} |"
            )
        ratios.append(seed_ratio(baseline, rl_train))
    lines.append("")
    notes = {
        "<": f" (the baseline never reached {TARGET}: rl-train's time over the baseline's whole run)",
        ">": f" (rl-train never reached {TARGET}: its whole run over the baseline's time)",
    }
    for (baseline, _), (relation, ratio) in zip(pairs, ratios, strict=True):
        shown = cell(ratio, ".2f") if relation in ("=", "-") else f"{relation} {ratio:.2f}"
        lines.append(f"seed {baseline.seed}: rl-train / baseline time to {TARGET} = {shown}{notes.get(relation, '')}")
    relations = {relation for relation, _ in ratios}
    values = [ratio for _, ratio in ratios if ratio is not None]
    if relations == {"="}:
        lines.append(f"median ratio over {len(values)} seeds: {statistics.median(values):.2f}; worst {max(values):.2f}")
    elif relations <= {"=", "<"}:
        lines.append(f"at most {max(values):.2f} on every seed (bounds where only rl-train reached {TARGET}): no median ratio")
    else:
        lines.append("rl-train did not reach the target on every seed the baseline did: no median ratio")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(DEMO_CONFIG))
    parser.add_argument("--no-prefect", action="store_true", help="rl-train with its phases called directly")
    parser.add_argument("--rl-train-args", nargs="*", default=[], help="dotted overrides for rl-train")
    parser.add_argument("--baseline-args", nargs=argparse.REMAINDER, default=[], help="flags for the baseline (last)")
    parser.add_argument("--json", action="store_true", help="also print every curve as one JSON line")
    parser.add_argument("--verbose", action="store_true", help="echo both sides' output")
    args = parser.parse_args(argv)
    prepare(args.config)
    pairs = []
    with tempfile.TemporaryDirectory(prefix="rlt-ttr-") as tmp:
        for seed in args.seeds:
            pairs.append(run_seed(seed, args, Path(tmp)))
            b, r = (c.summary()["seconds_to_target"] for c in pairs[-1])
            print(f"seed {seed}: baseline {b} s, rl-train {r} s to {TARGET}", file=sys.stderr, flush=True)
    print(format_report(pairs))
    if args.json:
        for pair in pairs:
            for curve in pair:
                print(json.dumps({**curve.summary(), "rewards": curve.rewards, "seconds": curve.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
