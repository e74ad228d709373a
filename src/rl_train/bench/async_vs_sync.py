"""Trained samples per second, and time to reward, of the three trainer modes on a real tool loop.

Every mode trains the same policy on the built-in tool task (``configs/tool-tiny.yaml``:
three-digit sums answered through the calculator, every trajectory a multi-turn
``tool_agent`` loop) for the same number of global steps (so the same number of trained
samples), on the same CPUs, with the same number of optimizer steps per global step. Every
tool call the loop makes waits a heavy-tailed delay before its answer
(``rollout.agent.tool_latency_median_s`` / ``tool_latency_sigma``: lognormal, a pure
function of the trajectory and the turn, so each mode meets the same tail on the same
prompts): a sandbox's latency. What differs is only what the mode overlaps:

- ``sync`` waits, every step, for the slowest tool call of the batch, then trains;
- ``colocate_async`` trains on the groups that are done while the rest of the tail (and
  the prefetched next batch) keeps running in the tools;
- ``separate_async`` keeps a standalone rollout pool generating on its own share of the
  CPUs, with ``parameter_sync_step`` local updates per global step and one global batch in
  flight beyond the one being trained (``replay.prefetch_batches = parameter_sync_step``,
  each local update sampling a ``parameter_sync_step``-th of a global batch;
  ``--prefetch-batches``). Since a weight push no longer ends the trajectories waiting on
  tools, groups are not held back, and two global batches in flight left the buffer holding
  finished groups two versions old (staleness 1.95 against 0.98; measured at a873a26).

The async modes run with their defaults: token-level IS and the staleness thresholds that
hold colocate_async to 1 version behind and separate_async to ``parameter_sync_step``.

The async modes run ``--batches-in-flight`` agent loops at once, split evenly over the
rollout replicas (separate_async runs ``--rollout-replicas``, by default one, on the
rollout's half of the threads beside the trainer's; with one replica per CPU the step was
longer, 3.11 s against 2.46 s, at a873a26), the queued groups shared evenly among a replica's loops;
their engine calls share batches (while one generates, the others' calls wait and then run
as one), so a loop held by its slowest tool holds only its own groups; sync generates its
one batch per step. The clock runs from the trainer's first hook (before any warm-up dispatch) to the end of each step, so start-up
(Ray, actors) is left out for every mode alike. The table gives samples/s and the ratio to
sync, measured in this run, plus the staleness (versions behind), evictions, rollout idle
fraction and trainer wait of each mode, the reward reached, and the wall time to a
``--window``-step mean training reward of ``--target`` (with its ratio to sync's: the
learning a mode's throughput buys, stale samples included). A second table gives each
mode's median seconds a step in each phase, and the rollout's busy seconds: where the time of
a step goes, so the bottleneck shows.

    python -m rl_train.bench.async_vs_sync                     # defaults below
    python -m rl_train.bench.async_vs_sync --steps 40 --median-seconds 0.2
    python -m rl_train.bench.async_vs_sync --modes sync separate_async actor.lr=0.002
    python -m rl_train.bench.async_vs_sync --config configs/arith-tiny.yaml  # single-turn task
    python -m rl_train.bench.async_vs_sync --modes sync separate_async --seeds 0,1,2  # ratios by seed
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rl_train.config import Config, load_config  # noqa: E402
from rl_train.flows.registry import get_trainer_class  # noqa: E402
from rl_train.modes import MODES as MODE_TABLE  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODES = tuple(MODE_TABLE)
"""Every trainer mode, in the table's order (sync first: the others' ratios are to it)."""
NORMAL_P99 = 2.326
"""The standard normal's 99th percentile: a lognormal's p99 / p50 is exp(2.326 sigma)."""


def mode_overrides(mode: str, args: argparse.Namespace) -> list[str]:
    """Same work in every mode; only the overlap and the CPU split differ."""
    cpus = os.cpu_count() or 2
    common = [
        f"trainer.mode={mode}",
        f"trainer.total_steps={args.steps}",
        f"trainer.train_batch_size={args.batch}",
        f"actor.ppo_mini_batch_size={args.batch // args.parameter_sync_step}",
        f"rollout.n={args.n}",
        "trainer.val_every_steps=0",
        "trainer.val_before_train=false",
        f"trainer.use_prefect={str(args.prefect).lower()}",
        f"rollout.agent.tool_latency_median_s={args.median_seconds}",
        f"rollout.agent.tool_latency_sigma={args.sigma}",
        f"run.name=async-vs-sync-{mode}-{time.strftime('%Y%m%d-%H%M%S')}",  # never reuse a run dir
        f"run.output_dir={args.output_dir}",
    ]
    if mode == "separate_async":  # the standalone pool gets its own share of the cores
        replicas = rollout_replicas(args)
        rollout_threads = max(cpus // 2 // replicas, 1)
        return [
            *common,
            f"trainer.parameter_sync_step={args.parameter_sync_step}",
            # groups in flight beyond the batch being trained, to cover the tool tail
            f"replay.prefetch_batches={prefetch_batches(args)}",
            "rollout.weight_sync.backend=bucketed",
            "rollout.weight_sync.transport=shm",
            f"rollout.num_replicas={replicas}",
            f"rollout.num_threads={rollout_threads}",
            f"actor.num_threads={max(cpus - cpus // 2, 1)}",
            # the same agent loops as the other async modes, split over the replicas
            f"rollout.agent.batches_in_flight={max(args.batches_in_flight // replicas, 1)}",
        ]
    # Co-located modes alternate rollout and training on all the cores.
    return [
        *common,
        "trainer.parameter_sync_step=1",
        f"rollout.num_threads={cpus}",
        f"actor.num_threads={cpus}",
        *([f"rollout.agent.batches_in_flight={args.batches_in_flight}"] if mode != "sync" else []),
    ]


def rollout_replicas(args: argparse.Namespace) -> int:
    """separate_async's rollout replicas: ``--rollout-replicas``, else one. They share the
    rollout's half of the torch threads (at least one each) beside the trainer's. One replica
    per CPU once kept the trainer from waiting on groups, when a weight push ended every
    trajectory waiting on a tool; since pushes pause the engine only, a second replica only
    adds a process competing for the two cores (median step 3.11 s against 2.46 s, measured at a873a26)."""
    given = getattr(args, "rollout_replicas", None)
    return int(given) if given is not None else 1


def prefetch_batches(args: argparse.Namespace) -> int:
    """separate_async's ``replay.prefetch_batches``: ``--prefetch-batches``, else
    ``parameter_sync_step`` (one global batch beyond the one being trained)."""
    given = getattr(args, "prefetch_batches", None)
    return int(given) if given is not None else args.parameter_sync_step


def first_reaching(rewards: list[float], target: float, window: int) -> int | None:
    """The first step (1-based) whose ``window``-step mean reward is at least ``target``."""
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window : end]) / window >= target:
            return end
    return None


def run_mode(mode: str, config: Config, target: float, window: int) -> dict[str, Any]:
    base = get_trainer_class(mode)

    class Timed(base):  # type: ignore[misc, valid-type]  # mypy takes no variable as a base class
        clock: dict[str, float] = {}
        step_ends: list[float] = []

        def on_train_begin(self) -> None:
            self.clock["start"] = time.perf_counter()
            super().on_train_begin()

        def step(self, step: int) -> dict[str, float]:
            metrics = super().step(step)
            self.step_ends.append(time.perf_counter() - self.clock["start"])
            return metrics

        def on_train_end(self) -> None:
            super().on_train_end()
            self.clock["end"] = time.perf_counter()

    history = Timed(config).fit()
    seconds = Timed.clock["end"] - Timed.clock["start"]
    rewards = [m["reward/mean"] for m in history]
    reached = first_reaching(rewards, target, window)
    samples = config.trainer.total_steps * config.trainer.train_batch_size * config.rollout.n
    last = history[-max(len(history) // 4, 1) :]

    def total(key: str) -> float:
        return sum(m.get(key, 0.0) for m in history)

    return {
        "mode": mode,
        "seconds": seconds,
        "samples_per_second": samples / seconds,
        "staleness_mean": mean(m.get("replay/staleness_mean", 0.0) for m in history),
        "staleness_max": max(m.get("replay/staleness_max", 0.0) for m in history),
        "evicted": {r: total(f"replay/evicted_{r}") for r in ("staleness", "filter", "failure")},
        "rescues": total("replay/rescue_activations"),
        "rollout_idle": mean(m["rollout/idle_fraction"] for m in history),
        "trainer_wait_s": total("replay/sample_wait_seconds"),
        "reward_first": history[0]["reward/mean"],
        "reward_last": mean(m["reward/mean"] for m in last),
        "steps_to_target": reached,
        "seconds_to_target": Timed.step_ends[reached - 1] if reached else None,
        "tool_calls_per_trajectory": mean(m.get("agent/tool_calls_mean", 0.0) for m in history),
        "rewards": rewards,
        "phases": phase_medians(history),
    }


PHASES = ("step", "generate", "old_log_prob", "ref", "update", "weight_sync")
"""The phases of the per-step table; ``generate`` is the trainer's wait for its batch."""


def phase_medians(history: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds per step of each phase and of the rollout's busy time, leaving out the
    first two steps (each actor's first passes, and an async mode's pipeline filling)."""
    steady = history[2:] or history
    keys = [f"timing/{phase}" for phase in PHASES] + ["rollout/busy_seconds"]
    return {key: median(m[key] for m in steady if key in m) for key in keys if any(key in m for m in steady)}


def format_phases(rows: list[dict[str, Any]]) -> str:
    keys = [f"timing/{phase}" for phase in PHASES] + ["rollout/busy_seconds"]
    header = " | ".join(key.split("/")[-1] for key in keys)
    lines = [f"| mode | {header} |", "| --- |" + " --- |" * len(keys)]
    for r in rows:
        cells = " | ".join(f"{r['phases'][key]:.2f}" if key in r.get("phases", {}) else "-" for key in keys)
        lines.append(f"| {r['mode']} | {cells} |")
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]], target: float = 0.9, window: int = 10) -> str:
    baseline = next((r["samples_per_second"] for r in rows if r["mode"] == "sync"), None)
    sync_to_target = next((r.get("seconds_to_target") for r in rows if r["mode"] == "sync"), None)
    lines = [
        "| mode | wall s | samples/s | vs sync | staleness mean / max | evicted stale / filter / fail "
        f"| rescues | rollout idle | trainer wait s | reward first -> last quarter | s to {window}-step mean {target} | sync / mode |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = f"{r['samples_per_second'] / baseline:.2f}x" if baseline else "-"
        ev = r["evicted"]
        to_target = r.get("seconds_to_target")
        reached = f"{to_target:.1f} (step {r['steps_to_target']})" if to_target else "not reached"
        sooner = f"{sync_to_target / to_target:.2f}x" if to_target and sync_to_target else "-"
        lines.append(
            f"| {r['mode']} | {r['seconds']:.1f} | {r['samples_per_second']:.1f} | {ratio} "
            f"| {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} "
            f"| {ev['staleness']:.0f} / {ev['filter']:.0f} / {ev['failure']:.0f} | {r['rescues']:.0f} "
            f"| {r['rollout_idle']:.0%} | {r['trainer_wait_s']:.1f} "
            f"| {r['reward_first']:.2f} -> {r['reward_last']:.2f} | {reached} | {sooner} |"
        )
    return "\n".join(lines)


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated integers (one argument, so that the config overrides
    after it stay overrides)."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds: {text!r} is not a comma-separated list of integers, e.g. 0,1,2") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds: give at least one seed, e.g. 0,1,2")
    return seeds


def format_seeds(rows: list[dict[str, Any]], target: float = 0.9, window: int = 10) -> str:
    """Per seed, each mode's time (and steps) to the ``window``-step mean ``target`` and its
    ratio to that seed's sync; then, per mode, the median, lowest and highest ratio over the
    seeds (a seed where either side never reached the target counts as no ratio)."""
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    lines = [f"| seed | {' | '.join(modes)} |", "| --- |" + " --- |" * len(modes)]
    ratios: dict[str, list[float | None]] = {m: [] for m in modes}
    for seed in seeds:
        by_mode = {r["mode"]: r for r in rows if r["seed"] == seed}
        sync_s = by_mode.get("sync", {}).get("seconds_to_target")
        cells = []
        for mode in modes:
            r = by_mode.get(mode)
            to_target = r.get("seconds_to_target") if r else None
            if r is None or not to_target:
                cells.append("not reached")
                ratios[mode].append(None)
                continue
            ratio = sync_s / to_target if sync_s else None
            ratios[mode].append(ratio)
            cells.append(f"{to_target:.1f} s (step {r['steps_to_target']})" + (f", {ratio:.2f}x" if ratio else ""))
        lines.append(f"| {seed} | {' | '.join(cells)} |")
    summary = []
    for mode in modes:
        if mode == "sync":
            continue
        got = [x for x in ratios[mode] if x is not None]
        missing = len(ratios[mode]) - len(got)
        text = f"median {median(got):.2f}x, {min(got):.2f}-{max(got):.2f}x" if got else "no ratio"
        summary.append(f"{mode}: {text} sooner than sync to a {window}-step mean of {target} over "
                       f"{len(seeds)} seeds" + (f" ({missing} without a ratio)" if missing else ""))  # fmt: skip
    return "\n".join([*lines, "", *summary])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "configs" / "tool-tiny.yaml"))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", type=int, default=16, help="global steps per mode")
    parser.add_argument("--batch", type=int, default=32, help="prompt groups per global step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--parameter-sync-step", type=int, default=4, help="separate_async local updates")
    parser.add_argument("--median-seconds", type=float, default=0.1, help="tool latency p50")
    parser.add_argument("--sigma", type=float, default=1.4, help="lognormal shape (1.4: p99/p50 = 26)")
    parser.add_argument(
        "--batches-in-flight", type=int, default=8,
        help="async modes: agent loops at once, split evenly over the rollout replicas (their engine calls share batches)",
    )  # fmt: skip
    parser.add_argument(
        "--rollout-replicas", type=int, default=None,
        help="separate_async: rollout replicas, each with rollout.num_threads threads (default: 1)",
    )  # fmt: skip
    parser.add_argument(
        "--prefetch-batches", type=int, default=None,
        help="separate_async: replay.prefetch_batches (default: --parameter-sync-step, one global batch)",
    )  # fmt: skip
    parser.add_argument("--target", type=float, default=0.9, help="training reward the time-to-reward column waits for")
    parser.add_argument("--window", type=int, default=10, help="steps in that moving mean")
    parser.add_argument("--prefect", action="store_true", help="run steps as Prefect flows (off: direct)")
    parser.add_argument("--output-dir", default="/tmp/rl-train-bench")
    parser.add_argument(
        "--seeds", type=seed_list, default=None, metavar="S[,S...]",
        help="run.seed of each round of the modes, comma-separated (default: the config's); with several, a last table gives each seed's ratios and their median",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="dotted config overrides applied to every mode")
    args = parser.parse_args(argv)
    p99 = args.median_seconds * math.exp(NORMAL_P99 * args.sigma)
    every: list[dict[str, Any]] = []
    for seed in args.seeds or [None]:
        rows = []
        for mode in args.modes:
            seeded = [f"run.seed={seed}"] if seed is not None else []
            config = load_config(args.config, [*mode_overrides(mode, args), *seeded, *args.overrides])
            rows.append({**run_mode(mode, config, args.target, args.window), "seed": config.run.seed})
            print(f"{mode} (seed {config.run.seed}): {rows[-1]['samples_per_second']:.1f} samples/s; rewards "
                  + " ".join(f"{r:.2f}" for r in rows[-1]["rewards"]), file=sys.stderr, flush=True)  # fmt: skip
        print(
            f"tool latency: p50 {args.median_seconds:.2f}s, p99 {p99:.2f}s per call; "
            f"{args.steps} steps x {args.batch} groups x {args.n} samples per mode; {os.cpu_count()} CPUs"
            + (f"; seed {rows[0]['seed']}" if args.seeds else "")
        )
        print(format_table(rows, args.target, args.window))
        print("\nmedian seconds a step (steps 3 on; generate: the trainer's wait for its batch; busy: the rollout's)")
        print(format_phases(rows), flush=True)
        every.extend(rows)
    if args.seeds and len(args.seeds) > 1:
        print(f"\ntime to a {args.window}-step mean of {args.target}, by seed")
        print(format_seeds(every, args.target, args.window))


if __name__ == "__main__":
    main()
