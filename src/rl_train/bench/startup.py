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
    python -m rl_train.bench.startup --resume --prefect-server   # a resumed run, as a retry runs
    python -m rl_train.bench.startup --processes   # and the CPU seconds of each process to step 1

``--resume`` times a resumed run instead: each variant has a run of its own, trained for one
step with a checkpoint beforehand (not timed), and every timed run trains one step more on the
same command, so it resumes from the newest checkpoint (``first_step`` is then the first
resumed step). ``--prefect-server`` gives the runs through Prefect a Prefect API server
started beforehand (``PREFECT_API_URL``), as a served deployment run and its retries have,
instead of the throwaway one each run starts for itself.

rl_train's own modules are compiled to bytecode first, as any run after the first finds them
(this matters where ``PYTHONDONTWRITEBYTECODE`` is set: every process would compile them
from source on every run).

The marks, in order: ``config`` (validated), ``inputs`` (data and run directory checked),
``imports`` (flows, pools and workers imported), ``prefect_api`` (the temporary API answers),
``ray`` (Ray is up), ``flow`` (the flow run began), ``rollout_ready`` / ``trainer_ready`` (the
pools' actors built their engines), ``workers`` (pools created, weight sync open),
``first_step`` (the first step's line printed). Below them: the CPU seconds that the run's
processes (the driver, Ray's, the workers, Prefect's server) had used by the first step, a
steadier figure than the wall time on a machine of two shared cores.

    python -m rl_train.bench.startup --variant plain-ray=env:RL_TRAIN_RAY_LEAN_HEAD=0   # Ray as ray.init starts it

An older checkout, laid out as the ``rl_train`` package under OLD, against this one (run from
outside the repository, so that each variant imports its own code), on its own demo config:

    python -m rl_train.bench.startup --variant old=env:PYTHONPATH=OLD,config:OLD/configs/arith-tiny.yaml
"""

from __future__ import annotations

import argparse
import contextlib
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
CPU_REPORT = re.compile(r"start-up CPU \(s, this process and every process under it\): ([0-9.]+)$")
PROCESS_REPORT = re.compile(r"start-up CPU by process \(s\): (.*)$")


PER_PROCESS = False
"""``--processes``: the runs report their CPU by process too (``RL_TRAIN_STARTUP_REPORT=processes``)."""


@dataclass
class Variant:
    name: str
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    prefect: bool = True
    resume: bool = False
    steps_done: int = 0
    """(``--resume``) Steps its run has trained so far; each timed run trains one more."""
    marks: list[dict[str, float]] = field(default_factory=list)
    exits: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    """CPU seconds of the run's processes (driver, Ray, workers, Prefect's server) to step 1."""
    processes: list[dict[str, float]] = field(default_factory=list)
    """(``--processes``) Each run's CPU seconds to step 1 by process name."""
    run_name: str = ""
    config: str | None = None
    """(``config:PATH``) The variant's own config file (an older checkout's), else the demo's."""

    def median(self, mark: str) -> float:
        values = [m[mark] for m in self.marks if mark in m]
        return statistics.median(values) if values else float("nan")


def parse_variant(text: str, prefect: bool) -> Variant:
    """``name=override,override``, ``name=env:KEY=VALUE,...`` or ``name=config:PATH,...``."""
    name, _, spec = text.partition("=")
    variant = Variant(f"{name}{'' if prefect else ' (no prefect)'}", prefect=prefect)
    for item in filter(None, spec.split(",")):
        if item.startswith("env:"):
            key, _, value = item[4:].partition("=")
            variant.env[key] = value
        elif item.startswith("config:"):
            variant.config = item[len("config:") :]
        else:
            variant.overrides.append(item)
    return variant


def compile_bytecode() -> None:
    """Compile rl_train's modules (every folder of its namespace) where no bytecode is."""
    import compileall
    import importlib

    import rl_train

    folders = {str(Path(rl_train.__file__).parent)}
    for name in ("flows", "tasks", "engines", "storage", "deployments", "bench", "examples"):
        with contextlib.suppress(ImportError):
            folders.update(importlib.import_module(f"rl_train.{name}").__path__)
    for folder in sorted(folders):
        compileall.compile_dir(folder, quiet=2)


def train_command(variant: Variant, config: str, workdir: Path, run_name: str, steps: int) -> list[str]:
    return [
        sys.executable, "-m", "rl_train.cli", "train", *([] if variant.prefect else ["--no-prefect"]),
        "--config", variant.config or config, f"model.path={workdir}/model", "model.create_if_missing=false",
        f"data.data_dir={workdir}/data", f"run.output_dir={workdir}/runs", f"run.name={run_name}",
        f"trainer.total_steps={steps}", "trainer.val_before_train=false", "trainer.val_every_steps=0",
        *(["checkpoint.every_steps=1"] if variant.resume else []), *variant.overrides,
    ]  # fmt: skip


def prepare_resume(variant: Variant, config: str, workdir: Path, index: int) -> None:
    """Train the variant's run for one step, with a checkpoint, without Prefect (not timed)."""
    variant.run_name = f"resume-{index}"
    quiet = Variant(variant.name, variant.overrides, variant.env, prefect=False, resume=True)
    done = subprocess.run(
        train_command(quiet, config, workdir, variant.run_name, 1),
        env={**os.environ, **variant.env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name}: preparing its run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    variant.steps_done = 1


def run_once(variant: Variant, config: str, workdir: Path, index: int, api_url: str | None = None) -> None:
    if variant.resume:
        variant.steps_done += 1
        command = train_command(variant, config, workdir, variant.run_name, variant.steps_done)
    else:
        command = train_command(variant, config, workdir, f"r{index}", 1)
    env = {**os.environ, "RL_TRAIN_STARTUP_REPORT": "processes" if PER_PROCESS else "1", **variant.env}
    if api_url and variant.prefect:
        env["PREFECT_API_URL"] = api_url
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = [REPORT.search(line) for line in done.stderr.splitlines()]
    report = next((m.group(1) for m in found if m), None)
    if report is None:
        raise RuntimeError(f"{variant.name}: no start-up line in its output:\n{done.stderr[-3000:]}")
    variant.marks.append({name: float(value) for name, value in (part.rsplit(" ", 1) for part in report.split(", "))})
    cpu = next((m.group(1) for m in map(CPU_REPORT.search, done.stderr.splitlines()) if m), None)
    if cpu is not None:
        variant.cpu.append(float(cpu))
    shares = next((m.group(1) for m in map(PROCESS_REPORT.search, done.stderr.splitlines()) if m), None)
    if shares:
        by_name: dict[str, float] = {}
        for part in shares.split(", "):
            name, _, seconds = part.rpartition(" ")
            by_name[name] = by_name.get(name, 0.0) + float(seconds)
        variant.processes.append(by_name)
    variant.exits.append(time.perf_counter() - started)


def run_variants(variants: list[Variant], runs: int, prefect_server: bool) -> None:
    """Time ``runs`` runs of each variant, interleaved (on a policy and data made beforehand)."""
    from rl_train.engines.model.tiny import create_tiny_policy
    from rl_train.storage.builtin_data import write_builtin_task

    config = str(Path(__file__).resolve().parents[3] / "configs" / "arith-tiny.yaml")
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="rlt-bench-startup-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        create_tiny_policy(workdir / "model", seed=0, pretrain_steps=0)
        write_builtin_task("single_digit_sum", str(workdir / "data"), seed=0)
        api_url = None
        if prefect_server and any(v.prefect for v in variants):
            from rl_train.flows.prefect_api import TEMPORARY_API_ENV, TemporaryPrefectAPI

            server = TemporaryPrefectAPI()
            api_url = server.start()
            stack.callback(server.stop)
            os.environ.pop(TEMPORARY_API_ENV, None)  # to the runs, a server of the user's
            os.environ.pop("PREFECT_API_URL", None)  # only the runs through Prefect get it
            server.wait_ready()
        for index, variant in enumerate(variants):
            if variant.resume:
                prepare_resume(variant, config, workdir, index)
        index = 0
        for round_ in range(runs):
            for variant in variants:
                run_once(variant, config, workdir, index, api_url)
                index += 1
                print(f"round {round_ + 1}/{runs} {variant.name}: first step at {variant.marks[-1]['first_step']:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip


def print_table(variants: list[Variant], runs: int) -> None:
    names = sorted({mark for v in variants for m in v.marks for mark in m}, key=lambda k: variants[0].median(k))
    print(f"\nstart-up, median of {runs} runs, seconds from process start")
    print(f"{'mark':>14} " + " ".join(f"{v.name:>26}" for v in variants))
    for mark in names:
        print(f"{mark:>14} " + " ".join(f"{v.median(mark):>26.2f}" for v in variants))
    print(f"{'exit':>14} " + " ".join(f"{statistics.median(v.exits):>26.2f}" for v in variants))
    cpu = [f"{statistics.median(v.cpu):.2f}" if v.cpu else "nan" for v in variants]
    print(f"{'cpu s, step 1':>14} " + " ".join(f"{text:>26}" for text in cpu))
    each = [" ".join(f"{m['first_step']:.1f}" for m in v.marks) for v in variants]
    print(f"{'first step, each':>14} " + " ".join(f"{text:>26}" for text in each))
    if any(v.processes for v in variants):
        print("\nCPU s to step 1 by process (median)")
        names = sorted({n for v in variants for p in v.processes for n in p}, key=lambda n: -max(
            statistics.median([p.get(n, 0.0) for p in v.processes]) for v in variants if v.processes))
        for name in names:
            cells = [statistics.median([p.get(name, 0.0) for p in v.processes]) if v.processes else float("nan")
                     for v in variants]  # fmt: skip
            print(f"{name[:24]:>24} " + " ".join(f"{c:>16.2f}" for c in cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per variant (the median is shown)")
    parser.add_argument("--variant", action="append", default=[], help="name=override,... or name=env:KEY=VALUE")
    parser.add_argument("--no-prefect-only", action="store_true", help="skip the runs through Prefect")
    parser.add_argument("--resume", action="store_true", help="time resumed runs (from a checkpoint)")
    parser.add_argument(
        "--processes", action="store_true", help="also print each process's CPU seconds to step 1 (driver, workers, Ray's, Prefect's)"
    )
    parser.add_argument(
        "--prefect-server", action="store_true", help="runs through Prefect use a server started beforehand"
    )
    args = parser.parse_args(argv)
    global PER_PROCESS
    PER_PROCESS = args.processes
    variants = [] if args.no_prefect_only else [Variant("default")]
    variants.append(Variant("default (no prefect)", prefect=False))
    for text in args.variant:
        variants += [] if args.no_prefect_only else [parse_variant(text, True)]
        variants.append(parse_variant(text, False))
    for variant in variants:
        variant.resume = args.resume
        if args.resume:
            variant.name = variant.name.replace("default", "resume", 1)
    run_variants(variants, args.runs, args.prefect_server)
    print_table(variants, args.runs)
    for variant in variants[1:]:
        base = next(v for v in variants if v.prefect == variant.prefect)
        if base is not variant:
            ratio = variant.median("first_step") / base.median("first_step")
            print(f"first step, {variant.name} / {base.name}: {ratio:.2f}")
            if variant.cpu and base.cpu:
                cpu_ratio = statistics.median(variant.cpu) / statistics.median(base.cpu)
                print(f"CPU seconds to step 1, {variant.name} / {base.name}: {cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
