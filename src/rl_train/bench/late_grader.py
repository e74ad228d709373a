"""A late grader must not stall rollout: separate_async's rollout tokens per second with a slow
judge against the same run with the fast rule reward (``reward.streaming``).

Each run goes through the built-in arithmetic task in ``separate_async`` for the same number of
global steps on the same CPUs, from the same policy, held fixed (``actor.lr`` 1e-12: every step
still trains and syncs weights, but both runs sample one distribution, so answer lengths are
alike and tokens per second compare rollout's pace alone, not two policies drifting apart). The fast run scores with the registered ``arith`` rule (a few
microseconds a batch); the slow one with ``SleepingGrader``, the same verdicts after a sleep of
``--grader-seconds`` per batch: a judge that decodes, or a remote grader, from the rollout's
point of view. With streaming scores (on by default in the async modes) each group is scored
on the reward pool as it finishes while rollout goes on, and the trainer samples groups whose
scores are in; the figure is ``rollout/tokens_per_second`` (every replica's sampled tokens over
the step's wall time), the mean over the steps after the first (start-up, and the grader's
first answer), and the ratio of the slow run's to the fast run's, measured in this run; and
``stalls``, the steps after the first whose sample waited over half a second for its groups. ``--no-streaming`` adds the slow grader
scored in the reward phase instead, for contrast.

    python -m rl_train.bench.late_grader                      # defaults below
    python -m rl_train.bench.late_grader --steps 10 --grader-seconds 2 --no-streaming
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from rl_train.engines.reward.base import BatchReward, Reward, RewardResult, Trajectory, score_all
from rl_train.engines.reward.config import RewardSettings
from rl_train.engines.reward.registry import build_reward

GRADER_SECONDS_ENV = "RL_TRAIN_LATE_GRADER_SECONDS"
"""The grader's sleep per batch, seconds (read where it is built: the reward worker's process)."""
DEFAULT_GRADER_SECONDS = 1.0
FIXED_POLICY_LR = 1e-12
"""Adam's steps at this rate are below float32's resolution for all but near-zero weights: the
policy is held fixed (``actor.lr`` must be above 0)."""
STALL_SECONDS = 0.5
"""A step whose sample waited this long for its groups: rollout (or scoring) fell behind."""
GRADER = "rl_train.bench.late_grader:SleepingGrader"
"""By import path, as a user names their reward (the module is ``__main__`` when run as a script)."""


class SleepingGrader:
    """The ``arith`` rule's verdicts, each batch after a sleep: a slow judge (a ``BatchReward``)."""

    concurrent = True
    """Its batches overlap (``reward.max_concurrent_batches``), as a remote grader's would."""

    def __init__(self, rule: Reward | BatchReward, seconds: float) -> None:
        self.rule, self.seconds = rule, seconds

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> SleepingGrader:
        seconds = float(os.environ.get(GRADER_SECONDS_ENV, DEFAULT_GRADER_SECONDS))
        return cls(build_reward("arith", settings), seconds)

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        time.sleep(self.seconds)
        return score_all(self.rule, trajectories, "arith")


def run_config(
    model_dir: Path, data_dir: Path, out: Path, name: str, steps: int, reward: str | None, streaming: bool
) -> dict[str, Any]:
    """A separate_async run of ``steps`` global steps (2 local updates each) on the arithmetic
    task, the policy held fixed."""
    return {
        "run": {"name": name, "output_dir": str(out), "seed": 0},
        "model": {"path": str(model_dir), "create_if_missing": False},
        "data": {"builtin_task": None, "data_dir": str(data_dir)},
        "trainer": {
            "mode": "separate_async",
            "total_steps": steps,
            "parameter_sync_step": 2,
            "train_batch_size": 8,
            "use_prefect": False,
            "val_every_steps": 0,
            "val_before_train": False,
        },
        "rollout": {"n": 4, "max_new_tokens": 8, "num_threads": 1, "weight_sync": {"transport": "shm"}},
        "actor": {"num_threads": 1, "lr": FIXED_POLICY_LR},
        "reward": {"streaming": streaming, **({"by_data_source": {"arith": reward}} if reward else {})},
        "replay": {"max_off_policy_threshold": 100},
    }


def measure(data: dict[str, Any]) -> dict[str, float]:
    """Run it; the rollout's tokens per second (steps after the first), and the scoring figures."""
    from rl_train.config import Config, apply_mode_defaults
    from rl_train.flows.train import run_training
    from rl_train.storage.metrics import read_metrics

    apply_mode_defaults(data)
    summary = run_training(Config.model_validate(data))
    metrics = read_metrics(summary["run_dir"])
    later = metrics[1:] or metrics
    return {
        "tokens_per_second": mean(m["rollout/tokens_per_second"] for m in later),
        "step_seconds": mean(m["timing/step"] for m in later),
        "response_length": mean(m["response_length/mean"] for m in later),
        "stalls": float(sum(m.get("replay/sample_wait_seconds", 0.0) > STALL_SECONDS for m in later)),
        "streamed": mean(m.get("reward/streamed", 0.0) for m in metrics),
        "awaiting_scores": max(m.get("replay/awaiting_scores_max", 0.0) for m in metrics),
    }


def compare(
    steps: int, grader_seconds: float, no_streaming: bool, workdir: Path, model_dir: Path | None = None
) -> dict[str, dict[str, float]]:
    """The fast and the slow runs (and the slow one without streaming), one after the other;
    ``model_dir``: the policy (the built-in tiny one, pretrained briefly, by default)."""
    from rl_train.engines.model.tiny import create_tiny_policy
    from rl_train.storage.builtin_data import write_builtin_task

    os.environ[GRADER_SECONDS_ENV] = str(grader_seconds)  # before Ray starts: its workers inherit it
    if model_dir is None:
        model_dir = create_tiny_policy(workdir / "model", seed=0, pretrain_steps=60)
    data_dir = workdir / "data"
    write_builtin_task("single_digit_sum", data_dir)
    runs = {"fast rule": (None, True), "slow grader": (GRADER, True)}
    if no_streaming:
        runs["slow grader, no streaming"] = (GRADER, False)
    results = {}
    for label, (reward, streaming) in runs.items():
        name = label.replace(",", "").replace(" ", "-")
        results[label] = measure(run_config(model_dir, data_dir, workdir / "runs", name, steps, reward, streaming))
    return results


def report(results: dict[str, dict[str, float]], steps: int, grader_seconds: float) -> None:
    """Print the table; adds each run's ``ratio`` (its tokens per second over the fast run's)."""
    fast = results["fast rule"]["tokens_per_second"]
    print(f"separate_async, {steps} global steps, grader sleeps {grader_seconds:g} s a batch")
    print(
        f"{'run':<28}{'tokens/s':>10}{'ratio':>8}{'step s':>9}{'length':>8}{'stalls':>8}"
        f"{'streamed':>10}{'awaiting':>10}"
    )
    for label, r in results.items():
        r["ratio"] = r["tokens_per_second"] / fast if fast else float("nan")
        print(
            f"{label:<28}{r['tokens_per_second']:>10.1f}{r['ratio']:>8.3f}{r['step_seconds']:>9.2f}"
            f"{r['response_length']:>8.2f}{r['stalls']:>8.0f}{r['streamed']:>10.2f}{r['awaiting_scores']:>10.0f}"
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="global steps per run")
    parser.add_argument("--grader-seconds", type=float, default=DEFAULT_GRADER_SECONDS, help="the slow grader's sleep per batch")
    parser.add_argument("--no-streaming", action="store_true", help="also run the slow grader scored in the reward phase")
    parser.add_argument("--model-dir", type=Path, default=None, help="a policy to use (default: the built-in tiny one, made now)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlt-late-grader-") as tmp:
        results = compare(args.steps, args.grader_seconds, args.no_streaming, Path(tmp), args.model_dir)
    report(results, args.steps, args.grader_seconds)
    return results


if __name__ == "__main__":
    main()
