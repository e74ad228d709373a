"""What a crash-tested run must show at the end: each step once, each prompt once per epoch,
and every launch resumed from the newest complete checkpoint, never from a torn one.

The run's prompt ledger (``trained_prompts.jsonl``) names, for each global step, the prompt
groups trained in it: ``p<i>`` for the i-th prompt drawn over the whole run, which is row
``order(i // L)[i % L]`` of the train set of L rows (``PromptLoader``'s seeded shuffle of
epoch ``i // L``). Sync draws exactly what it trains, so the ledger must hold ``p0`` up to
``p<steps x batch - 1>`` once each. The async modes keep up to ``prefetch_batches + 1``
batches of drawn prompts in flight, and those still in flight when the run ends are never
trained: there, the epochs before the oldest untrained draw are the *covered* epochs, and
each of their prompts must have been trained exactly once. Outside them a prompt counts as
lost when more draws went untrained than can be in flight (``bound``), or when an untrained
draw is older than ``T - bound`` (T groups trained): groups in flight are refilled one for
one and sampled oldest first, and the tiny run's four-token answers never keep one out for
long, so only the last draws can still be in flight when the run ends.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rl_train.flows.resume import LEDGER_FILE
from rl_train.storage.dataset import PromptLoader, load_prompts
from rl_train.storage.metrics import read_metrics

if TYPE_CHECKING:
    from rl_train.bench.crash_harness import CrashInputs
    from rl_train.bench.crash_life import Life

MIN_COVERED_EPOCHS = 2


@dataclass
class AuditResult:
    step_problems: list[str] = field(default_factory=list)
    """metrics.jsonl and the ledger: each step once, each prompt of the covered epochs once."""
    resume_problems: list[str] = field(default_factory=list)
    """A launch that did not resume from the newest complete checkpoint, or loaded a torn one."""
    covered_epochs: int = 0
    num_trained: int = 0
    untrained_draws: list[int] = field(default_factory=list)
    """Draws below the newest trained one that were never trained (async: in flight at the end)."""
    loaded_steps: list[tuple[int, int]] = field(default_factory=list)
    """(launch, checkpoint step it announced it resumed from)."""

    @property
    def problems(self) -> list[str]:
        return self.step_problems + self.resume_problems


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines() if line.strip()]


def metrics_problems(run_dir: Path, total_steps: int) -> list[str]:
    steps = [row["step"] for row in read_metrics(str(run_dir))]
    if steps == list(range(1, total_steps + 1)):
        return []
    repeated = sorted(s for s, n in Counter(steps).items() if n > 1)
    missing = sorted(set(range(1, total_steps + 1)) - set(steps))
    return [f"metrics.jsonl steps are not 1..{total_steps} once each: repeated {repeated}, missing {missing}"]


def ledger_problems(run_dir: Path, train_file: Path, result: AuditResult) -> list[str]:
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    total_steps, batch = config["trainer"]["total_steps"], config["trainer"]["train_batch_size"]
    in_flight_bound = (
        0 if config["trainer"]["mode"] == "sync" else (config["replay"]["prefetch_batches"] + 1) * batch
    )
    rows = read_ledger(run_dir)
    problems = []
    if [row["step"] for row in rows] != list(range(1, total_steps + 1)):
        problems.append(
            f"{LEDGER_FILE} steps are not 1..{total_steps} once each: {[row['step'] for row in rows]}"
        )
    problems += [
        f"step {row['step']} trained {len(row['groups'])} groups, not {batch}"
        for row in rows
        if len(row["groups"]) != batch
    ]
    where: dict[str, list[int]] = {}
    for row in rows:
        for group in row["groups"]:
            where.setdefault(group, []).append(row["step"])
    problems += [
        f"prompt group {g} trained more than once: in steps {steps}"
        for g, steps in where.items()
        if len(steps) > 1
    ]
    indices = sorted(int(group[1:]) for group in where)
    result.num_trained = len(indices)
    if not indices:
        return [*problems, "no prompt was trained"]
    result.untrained_draws = sorted(set(range(indices[-1] + 1)) - set(indices))
    if len(result.untrained_draws) > in_flight_bound:
        problems.append(
            f"{len(result.untrained_draws)} drawn prompts were never trained, more than the {in_flight_bound} "
            f"that can be in flight at the end: lost {result.untrained_draws[:40]}"
        )
    lost = [u for u in result.untrained_draws if u < len(indices) - in_flight_bound]
    if lost:
        problems.append(f"prompts drawn long before the end and never trained (lost): {lost[:40]}")
    prompts = load_prompts([train_file])
    boundary = result.untrained_draws[0] if result.untrained_draws else indices[-1] + 1
    result.covered_epochs = boundary // len(prompts)
    problems += _epoch_problems(prompts, int(config["run"]["seed"]), set(indices), result.covered_epochs)
    if result.covered_epochs < MIN_COVERED_EPOCHS:
        problems.append(f"only {result.covered_epochs} epoch(s) covered; the test needs {MIN_COVERED_EPOCHS}")
    return problems


def _epoch_problems(prompts: list[dict[str, Any]], seed: int, trained: set[int], epochs: int) -> list[str]:
    """Each covered epoch, in prompts: every row of the train set trained exactly once."""
    row_of = {id(row): j for j, row in enumerate(prompts)}
    problems = []
    for epoch in range(epochs):
        draws = range(epoch * len(prompts), (epoch + 1) * len(prompts))
        rows = Counter(
            row_of[id(PromptLoader(prompts, seed=seed, position=i).next()[1])] for i in draws if i in trained
        )
        wrong = {j: rows.get(j, 0) for j in range(len(prompts)) if rows.get(j, 0) != 1}
        if wrong:
            problems.append(f"epoch {epoch}: train rows not trained exactly once (row: times) {wrong}")
    return problems


def resume_problems(lives: list[Life], result: AuditResult) -> list[str]:
    """Every launch that got as far as loading announced the checkpoint the harness had found
    newest and complete (``CheckpointStore.latest_valid``: manifest, sizes and checksums) just
    before it, never a folder a kill had torn, and its steps continued right after it."""
    problems = []
    for previous, life in zip([None, *lives], lives, strict=False):
        loaded, expected = life.resumed_from(), life.expected_resume_step
        torn_before = previous.torn_after if previous is not None else []
        steps = life.progress_steps()
        if loaded is not None:
            result.loaded_steps.append((life.index, loaded))
            if loaded in torn_before:
                problems.append(
                    f"launch {life.index} loaded checkpoint {loaded}, a folder torn by the kill before it"
                )
            if loaded != expected:
                problems.append(
                    f"launch {life.index} resumed from checkpoint {loaded}; the newest complete one was {expected}"
                )
        elif expected and steps:
            problems.append(f"launch {life.index} started over although checkpoint {expected} was complete")
        if steps and steps[0] != (loaded or 0) + 1:
            problems.append(
                f"launch {life.index} resumed from {loaded or 0} but its first step was {steps[0]}"
            )
    return problems


def audit_run(run_dir: Path, lives: list[Life], inputs: CrashInputs) -> AuditResult:
    result = AuditResult()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    result.step_problems += metrics_problems(run_dir, config["trainer"]["total_steps"])
    result.step_problems += ledger_problems(run_dir, inputs.train_file, result)
    result.resume_problems += resume_problems(lives, result)
    return result


def compare_final_weights(run_dir: Path, baseline_dir: Path) -> list[str]:
    """Tensors of the two runs' final policies that are not bitwise equal (and key mismatches)."""
    from safetensors.torch import load_file

    a = load_file(str(run_dir / "policy" / "model.safetensors"))
    b = load_file(str(baseline_dir / "policy" / "model.safetensors"))
    problems = [f"tensor {k} only in one of the runs" for k in sorted(a.keys() ^ b.keys())]
    problems += [
        f"tensor {k} differs from the uninterrupted run's (max abs diff {(a[k].double() - b[k].double()).abs().max():.3g})"
        for k in sorted(a.keys() & b.keys())
        if a[k].dtype != b[k].dtype or not a[k].equal(b[k])
    ]
    return problems


def compare_ledgers(run_dir: Path, baseline_dir: Path) -> list[str]:
    ours, theirs = read_ledger(run_dir), read_ledger(baseline_dir)
    return [
        f"step {x['step']} trained {x['groups']}, the uninterrupted run {y['groups']}"
        for x, y in zip(ours, theirs, strict=False)
        if x != y
    ] + ([] if len(ours) == len(theirs) else [f"{len(ours)} ledger rows against {len(theirs)}"])
