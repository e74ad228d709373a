"""Start-up of ``rl-train train``: seconds from process start to each part being ready.

Runs a one-step training run of the demo config (on a policy and data made once beforehand,
so their creation is not counted) again and again, variants interleaved so that a noisy
machine hurts each alike, and reads the ``start-up`` line the run prints after its first step
(``RL_TRAIN_STARTUP_REPORT=1``: marks from ``rl_train/startup_clock.py``). Prints the median
of every mark per variant, and each variant's time to the first step against the first
variant's, measured in the same run.

    python -m rl_train.bench.startup                     # through Prefect and with --no-prefect
    python -m rl_train.bench.startup --runs 5 --variant transformers=model.impl=transformers
    python -m rl_train.bench.startup --variant conc8=env:RAY_worker_maximum_startup_concurrency=8

The marks, in order: ``config`` (validated), ``inputs`` (data and run directory checked),
``imports`` (flows, pools and workers imported), ``prefect_api`` (the temporary API answers),
``ray`` (Ray is up), ``flow`` (the flow run began), ``rollout_ready`` / ``trainer_ready`` (the
pools' actors built their engines), ``workers`` (pools created, weight sync open),
``first_step`` (the first step's line printed).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPORT = re.compile(r"start-up \(s from process start\): (.*)$")


@dataclass
class Variant:
    name: str
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    prefect: bool = True
    marks: list[dict[str, float]] = field(default_factory=list)
    exits: list[float] = field(default_factory=list)

    def median(self, mark: str) -> float:
        values = [m[mark] for m in self.marks if mark in m]
        return statistics.median(values) if values else float("nan")


def parse_variant(text: str, prefect: bool) -> Variant:
    """``name=override,override`` or ``name=env:KEY=VALUE,...``."""
    name, _, spec = text.partition("=")
    variant = Variant(f"{name}{'' if prefect else ' (no prefect)'}", prefect=prefect)
    for item in filter(None, spec.split(",")):
        if item.startswith("env:"):
            key, _, value = item[4:].partition("=")
            variant.env[key] = value
        else:
            variant.overrides.append(item)
    return variant


def run_once(variant: Variant, config: str, workdir: Path, index: int) -> None:
    command = [
        sys.executable, "-m", "rl_train.cli", "train", *([] if variant.prefect else ["--no-prefect"]),
        "--config", config, f"model.path={workdir}/model", "model.create_if_missing=false",
        f"data.data_dir={workdir}/data", f"run.output_dir={workdir}/runs", f"run.name=r{index}",
        "trainer.total_steps=1", "trainer.val_before_train=false", "trainer.val_every_steps=0",
        *variant.overrides,
    ]  # fmt: skip
    env = {**os.environ, "RL_TRAIN_STARTUP_REPORT": "1", **variant.env}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = [REPORT.search(line) for line in done.stderr.splitlines()]
    report = next((m.group(1) for m in found if m), None)
    if report is None:
        raise RuntimeError(f"{variant.name}: no start-up line in its output:\n{done.stderr[-3000:]}")
    variant.marks.append({name: float(value) for name, value in (part.rsplit(" ", 1) for part in report.split(", "))})
    variant.exits.append(time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per variant (the median is shown)")
    parser.add_argument("--variant", action="append", default=[], help="name=override,... or name=env:KEY=VALUE")
    parser.add_argument("--no-prefect-only", action="store_true", help="skip the runs through Prefect")
    args = parser.parse_args(argv)
    from rl_train.engines.model.tiny import create_tiny_policy
    from rl_train.storage.builtin_data import write_builtin_task

    config = str(Path(__file__).resolve().parents[1] / "configs" / "arith-tiny.yaml")
    variants = [] if args.no_prefect_only else [Variant("default")]
    variants.append(Variant("default (no prefect)", prefect=False))
    for text in args.variant:
        variants += [] if args.no_prefect_only else [parse_variant(text, True)]
        variants.append(parse_variant(text, False))
    with tempfile.TemporaryDirectory(prefix="rlt-bench-startup-") as tmp:
        workdir = Path(tmp)
        create_tiny_policy(workdir / "model", seed=0, pretrain_steps=0)
        write_builtin_task("single_digit_sum", str(workdir / "data"), seed=0)
        index = 0
        for round_ in range(args.runs):
            for variant in variants:
                run_once(variant, config, workdir, index)
                index += 1
                print(f"round {round_ + 1}/{args.runs} {variant.name}: first step at {variant.marks[-1]['first_step']:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    names = sorted({mark for v in variants for m in v.marks for mark in m}, key=lambda k: variants[0].median(k))
    print(f"\nstart-up, median of {args.runs} runs, seconds from process start")
    print(f"{'mark':>14} " + " ".join(f"{v.name:>26}" for v in variants))
    for mark in names:
        print(f"{mark:>14} " + " ".join(f"{v.median(mark):>26.2f}" for v in variants))
    print(f"{'exit':>14} " + " ".join(f"{statistics.median(v.exits):>26.2f}" for v in variants))
    for variant in variants[1:]:
        base = next(v for v in variants if v.prefect == variant.prefect)
        if base is not variant:
            ratio = variant.median("first_step") / base.median("first_step")
            print(f"first step, {variant.name} / {base.name}: {ratio:.2f}")


if __name__ == "__main__":
    main()
