"""Crash test of resume (R-9.3): kill -9 a training run again and again, re-run its command
each time, and check that nothing was lost or repeated.

    python -m rl_train.bench.crash_harness --modes sync colocate_async separate_async --kills 20

Each mode's run (``rl-train train --no-prefect``, a tiny policy, a few dozen prompts so that
epochs are short, a checkpoint after every step) is started in a subprocess through
``crash_probe``, which marks checkpoint writes and weight pushes on stderr. The harness kills
the run's whole process group with SIGKILL at seeded moments: a random fraction into a
checkpoint write, as a weight push begins, or at a random time (start-up and restore
included); then it re-runs the same command, until one run finishes. Before each launch it
verifies the newest complete checkpoint itself, which is the one the run must announce it
resumed from. At the end ``crash_audit`` reads the run's prompt ledger and metrics.

Sync mode is also run once without kills: with a fixed seed its final weights and ledger must
equal those of the run that was killed. The summary prints the kill count, where each kill
landed and how long everything took; a problem found is printed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from rl_train.bench.crash_audit import AuditResult, audit_run, compare_final_weights, compare_ledgers
from rl_train.bench.crash_life import Life, LifeRunner
from rl_train.bench.crash_sweep import remove_shm, shm_files
from rl_train.bench.crash_trigger import KINDS, Estimates, KillTrigger
from rl_train.modes import MODES as MODE_TABLE
from rl_train.storage.checkpoint import CheckpointStore, parse_step_dir

MODES = tuple(MODE_TABLE)
"""Every trainer mode, in the table's order."""
MIN_AIMED_HITS = 1
"""Proven kills each mode needs inside a checkpoint write and inside a weight sync."""
EXTRA_AIMED_KILLS = 6
"""Kills added, beyond the planned ones, while a window has not been hit yet."""


MODE_OVERRIDES: dict[str, list[str]] = {
    # async: nothing is evicted for staleness, so every drawn prompt must be trained
    "colocate_async": ["replay.max_off_policy_threshold=100"],
    # and two local updates per step, over small shared-memory buckets
    "separate_async": [
        "replay.max_off_policy_threshold=100",
        "trainer.parameter_sync_step=2",
        "rollout.weight_sync.bucket_size_bytes=65536",
    ],
}
"""What each mode's crash run sets beyond the common overrides."""
BITWISE_MODES = ("sync",)
"""Modes whose run is deterministic: their final weights are compared with an uninterrupted run's."""


@dataclass(frozen=True)
class CrashInputs:
    """The tiny policy and a small train set, made once and shared by every mode."""

    model_dir: Path
    data_dir: Path
    train_file: Path
    num_prompts: int


def prepare_inputs(work_dir: Path, num_prompts: int = 24, pretrain_steps: int = 60) -> CrashInputs:
    """``rl-train init-model`` and ``init-data``, then the first ``num_prompts`` train rows."""
    model_dir, data_dir = work_dir / "model", work_dir / "data"
    cli = [sys.executable, "-m", "rl_train.cli"]
    if not (model_dir / "config.json").exists():
        subprocess.run(
            [*cli, "init-model", "--out", str(model_dir), "--pretrain-steps", str(pretrain_steps)],
            check=True,
            capture_output=True,
        )
    if not (data_dir / "train.parquet").exists():
        subprocess.run([*cli, "init-data", "--out", str(data_dir)], check=True, capture_output=True)
    train_file = work_dir / f"train-{num_prompts}.parquet"
    table = pq.read_table(data_dir / "train.parquet")
    if table.num_rows < num_prompts:
        raise ValueError(f"{data_dir}/train.parquet has {table.num_rows} rows, fewer than {num_prompts}")
    pq.write_table(table.slice(0, num_prompts), train_file)
    return CrashInputs(model_dir, data_dir, train_file, num_prompts)


@dataclass
class CrashSettings:
    mode: str
    num_kills: int = 20
    seed: int = 0
    total_steps: int = 64
    """Enough for every kill to find a run still going: each aimed kill costs the run a step or
    two, and a random kill after the first step can let a life run a few dozen (colocate_async
    once finished its 48 steps after 19 kills, once start-up had become faster)."""
    train_batch_size: int = 8
    extra_overrides: list[str] = field(default_factory=list)

    def overrides(self, inputs: CrashInputs, runs_dir: Path, name: str) -> list[str]:
        common = [
            f"run.output_dir={runs_dir}",
            f"run.name={name}",
            f"run.seed={self.seed}",
            f"trainer.mode={self.mode}",
            f"model.path={inputs.model_dir}",
            "model.create_if_missing=false",
            "data.builtin_task=null",
            f"data.data_dir={inputs.data_dir}",
            f"data.train_files=[{inputs.train_file}]",
            f"trainer.total_steps={self.total_steps}",
            f"trainer.train_batch_size={self.train_batch_size}",
            "trainer.val_every_steps=0",
            "trainer.val_before_train=false",
            "rollout.n=4",
            "rollout.max_new_tokens=4",
            "rollout.num_threads=1",
            "actor.num_threads=1",
            "checkpoint.every_steps=1",
        ]
        return [*common, *MODE_OVERRIDES.get(self.mode, []), *self.extra_overrides]


@dataclass
class CrashReport:
    settings: CrashSettings
    run_dir: Path
    lives: list[Life]
    audit: AuditResult
    shm_left: list[str]
    """/dev/shm files the run's processes used that outlived them (removed after recording)."""
    verified_at_end: dict[int, list[str]]
    """``CheckpointStore.verify`` of each checkpoint kept at the end ([]: whole)."""
    seconds: float
    baseline_run_dir: Path | None = None
    """Sync: the same config run once without kills."""
    baseline_seconds: float = 0.0
    baseline_problems: list[str] = field(default_factory=list)
    """Sync: final tensors not bitwise equal to the uninterrupted run's, ledger rows that differ."""

    @property
    def killed(self) -> list[Life]:
        return [life for life in self.lives if life.killed_at is not None]

    def checkpoint_write_kills(self) -> list[Life]:
        return [life for life in self.killed if life.torn_writes()]

    def weight_sync_kills(self) -> list[Life]:
        return [life for life in self.killed if life.open_syncs()]

    def survivors(self) -> list[str]:
        return [f"life {life.index}: {p.describe()}" for life in self.lives for p in life.survivors]

    def outside_group(self) -> list[str]:
        return [f"life {life.index}: {p.describe()}" for life in self.lives for p in life.outside_group]

    def summary(self) -> str:
        lines = [
            f"{self.settings.mode}: {len(self.killed)} kills over {len(self.lives)} launches in {self.seconds:.0f} s "
            f"({self.audit.covered_epochs} epochs covered, {self.audit.num_trained} groups trained); "
            f"{len(self.checkpoint_write_kills())} kill(s) left a torn checkpoint write, "
            f"{len(self.weight_sync_kills())} landed in a weight sync",
        ]
        for life in self.lives:
            start = life.resumed_from()
            lines.append(
                f"  launch {life.index:2d} aim {life.kind or '-':10s} from ckpt {start if start is not None else 0:3d} "
                f"(expected {life.expected_resume_step:3d}) steps {_span(life.progress_steps())}, "
                f"{life.outcome()} in {life.phase()}"
            )
        lines += [
            f"  outside the run's process group (a group kill misses it): {p}" for p in self.outside_group()
        ]
        unattributed = sorted(set().union(*(life.shm_unattributed for life in self.lives)))
        lines += [
            f"  /dev/shm/{name} appeared during a launch, unheld after it (whose?)" for name in unattributed
        ]
        if self.baseline_run_dir is not None:
            lines.append(f"  uninterrupted run: {self.baseline_seconds:.0f} s")
        for problem in self.problems():
            lines.append(f"  PROBLEM: {problem}")
        return "\n".join(lines)

    def problems(self) -> list[str]:
        found = list(self.audit.problems)
        found += [f"process left after a kill: {s}" for s in self.survivors()]
        found += [f"shared memory left by the run: /dev/shm/{name}" for name in self.shm_left]
        found += [
            f"checkpoint {step} does not verify at the end: {p}"
            for step, p in self.verified_at_end.items()
            if p
        ]
        return found + self.baseline_problems


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if steps else "none"


def checkpoint_state(root: Path) -> tuple[list[int], dict[int, float]]:
    """(committed steps, torn step folders -> the newest mtime in each) under a checkpoint root."""
    if not root.exists():
        return [], {}
    committed = CheckpointStore(str(root)).complete_steps()
    torn = {}
    for entry in root.iterdir():
        step = parse_step_dir(entry.name)
        if step is not None and step not in committed:
            torn[step] = max([entry.stat().st_mtime, *(p.stat().st_mtime for p in entry.rglob("*"))])
    return committed, torn


def plan_kinds(num_kills: int, rng: random.Random) -> list[str]:
    """An even share of each aim, in a seeded order."""
    kinds = [KINDS[i % len(KINDS)] for i in range(num_kills)]
    rng.shuffle(kinds)
    return kinds


class CrashTest:
    """One mode's crash test under ``work_dir``; ``run()`` returns its report."""

    def __init__(self, settings: CrashSettings, inputs: CrashInputs, work_dir: Path) -> None:
        self.settings = settings
        self.inputs = inputs
        self.work_dir = work_dir
        self.runs_dir = work_dir / "runs"
        self.rng = random.Random(settings.seed)
        self.estimates = Estimates()

    def _runner(self, name: str) -> LifeRunner:
        # A short path of its own: Ray's socket paths under it must stay within 107 bytes.
        ray_dir = tempfile.mkdtemp(prefix="rlt-crash-", dir="/tmp")
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RL_TRAIN_RAY_TMPDIR": ray_dir,
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        command = [sys.executable, "-m", "rl_train.bench.crash_probe", "train", "--no-prefect"]
        command += self.settings.overrides(self.inputs, self.runs_dir, name)
        log_dir = self.work_dir / "logs" / name
        log_dir.mkdir(parents=True, exist_ok=True)
        return LifeRunner(command, env, ray_dir, log_dir)

    def run(self) -> CrashReport:
        started = time.monotonic()
        name = self.settings.mode
        runner = self._runner(name)
        root = self.runs_dir / name / "checkpoints"
        shm_before = shm_files()
        planned = plan_kinds(self.settings.num_kills, self.rng)
        lives: list[Life] = []
        while True:
            kind = self._next_kind(planned, lives)
            store = CheckpointStore(str(root)) if root.exists() else None
            expected = (store.latest_valid() or 0) if store is not None else 0
            checked = store.verify(expected) if store is not None and expected else []
            life = runner.run(Life(len(lives), kind, expected, checked), self._trigger(kind))
            life.committed_after, life.torn_after = checkpoint_state(root)
            lives.append(life)
            self.estimates.learn(life.lines)
            if life.killed_at is None:
                if life.exit_code != 0:
                    tail = "\n".join(line for _, line in life.lines[-30:])
                    raise RuntimeError(f"{name}: launch {life.index} failed (exit {life.exit_code}):\n{tail}")
                break
        runner.remove_ray_dir()
        seen = set().union(*(life.shm_seen for life in lives))
        shm_left = sorted((shm_files() - shm_before) & seen)
        remove_shm(set(shm_left))
        store = CheckpointStore(str(root))
        report = CrashReport(
            self.settings,
            self.runs_dir / name,
            lives,
            audit_run(self.runs_dir / name, lives, self.inputs),
            shm_left,
            {step: store.verify(step) for step in store.complete_steps()},
            time.monotonic() - started,
        )
        if self.settings.mode in BITWISE_MODES:
            baseline_started = time.monotonic()
            straight_runner = self._runner(f"{name}-straight")
            straight = straight_runner.run(Life(0, None, 0), None)
            straight_runner.remove_ray_dir()
            if straight.exit_code != 0:
                raise RuntimeError(f"the uninterrupted run failed (exit {straight.exit_code})")
            report.baseline_run_dir = self.runs_dir / f"{name}-straight"
            report.baseline_seconds = time.monotonic() - baseline_started
            report.baseline_problems = compare_final_weights(report.run_dir, report.baseline_run_dir)
            report.baseline_problems += compare_ledgers(report.run_dir, report.baseline_run_dir)
            report.baseline_problems += [
                f"left by the uninterrupted run: {p.describe()}" for p in straight.survivors
            ]
        return report

    def _next_kind(self, planned: list[str], lives: list[Life]) -> str | None:
        """The planned aims in order; then, while a window has no proven hit yet, a few more
        aimed at it; then None (the run is left to finish)."""
        done = len([life for life in lives if life.killed_at is not None])
        if done < len(planned):
            return planned[done]
        extra = done - len(planned)
        if extra < EXTRA_AIMED_KILLS:
            if sum(bool(life.torn_writes()) for life in lives) < MIN_AIMED_HITS:
                return "checkpoint"
            if sum(bool(life.open_syncs()) for life in lives) < MIN_AIMED_HITS:
                return "sync"
        return None

    def _trigger(self, kind: str | None) -> KillTrigger | None:
        root = self.runs_dir / self.settings.mode / "checkpoints"
        return None if kind is None else KillTrigger(kind, self.rng, self.estimates, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--kills", type=int, default=20, help="planned kills per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=24, help="train set size (epochs of prompts/8 steps)")
    parser.add_argument("--work-dir", help="where models, data, runs and logs go (default: a new temp dir)")
    args = parser.parse_args(argv)
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="rlt-crash-work-"))
    inputs = prepare_inputs(work_dir, args.prompts)
    failed = False
    for mode in args.modes:
        settings = CrashSettings(mode, num_kills=args.kills, seed=args.seed, total_steps=args.total_steps)
        report = CrashTest(settings, inputs, work_dir / mode).run()
        print(report.summary(), flush=True)
        failed = failed or bool(report.problems())
    print(f"work dir: {work_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
