"""The built-in code task learns: the policy writes a tiny function, scored by unit tests in the sandbox.

Trains ``configs/code-tiny.yaml`` (the ``tiny_function`` task, the ``code_tests`` reward on the
prompt followed by the response) with its phases called directly, once per seed, from a policy
and data made in a temporary folder. Prints, per seed, the mean training reward over the first
and the last ``WINDOW`` steps, and whether it went from below ``START_BELOW`` to at least
``END_AT_LEAST`` (the issue's "from below 0.3 to at least 0.7"); then the wall seconds, and the
seconds of the reward phase per step (each distinct response a sandbox run; the cache's share
is in the figures of ``bench/RESULTS.md``). Exits 1 when a seed fails.

    python -m rl_train.bench.code_task                     # seed 0, the config's steps
    python -m rl_train.bench.code_task trainer.total_steps=40 --seeds 0 1   # overrides before --seeds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rl_train.config import load_config  # noqa: E402
from rl_train.flows.base import prepare_inputs  # noqa: E402
from rl_train.flows.train import run_training  # noqa: E402
from rl_train.storage.metrics import read_metrics  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "code-tiny.yaml"
WINDOW = 5
START_BELOW, END_AT_LEAST = 0.3, 0.7


@dataclass(frozen=True)
class Outcome:
    seed: int
    rewards: list[float]
    reward_seconds: list[float]
    seconds: float

    @property
    def start(self) -> float:
        return mean(self.rewards[:WINDOW])

    @property
    def end(self) -> float:
        return mean(self.rewards[-WINDOW:])

    @property
    def passed(self) -> bool:
        return self.start < START_BELOW and self.end >= END_AT_LEAST

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"seed {self.seed}: reward {self.start:.3f} -> {self.end:.3f} (first and last {WINDOW} steps of "
            f"{len(self.rewards)}) {verdict}; {self.seconds:.1f} s; reward phase {mean(self.reward_seconds):.2f} s "
            f"a step (first {WINDOW}: {mean(self.reward_seconds[:WINDOW]):.2f} s, last {WINDOW}: "
            f"{mean(self.reward_seconds[-WINDOW:]):.2f} s)"
        )


def train(seed: int, workdir: Path, overrides: list[str]) -> Outcome:
    """One run of the config at ``seed`` (the policy and data under ``workdir``, made once)."""
    inputs = [f"model.path={workdir / 'model'}", f"data.data_dir={workdir / 'data'}"]
    prepare_inputs(load_config(CONFIG, [*inputs, *overrides]))
    config = load_config(
        CONFIG,
        [
            *inputs,
            f"run.seed={seed}",
            f"run.name=code-task-{seed}",
            f"run.output_dir={workdir / 'runs'}",
            "trainer.use_prefect=false",
            "trainer.val_every_steps=0",
            "trainer.val_before_train=false",
            "checkpoint.every_steps=0",
            *overrides,
        ],
    )
    started = time.perf_counter()
    rows = read_metrics(run_training(config)["run_dir"])
    seconds = time.perf_counter() - started
    return Outcome(seed, [r["reward/mean"] for r in rows], [r.get("timing/reward", 0.0) for r in rows], seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. trainer.total_steps=40")
    args = parser.parse_args(argv)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="code-task-") as tmp:
        for seed in args.seeds:
            outcome = train(seed, Path(tmp), args.overrides)
            print(outcome.line(), flush=True)
            print("  rewards: " + " ".join(f"{r:.2f}" for r in outcome.rewards), flush=True)
            outcomes.append(outcome)
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
