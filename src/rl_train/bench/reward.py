"""What a reward kind costs: the scoring throughput of a rule, a reward model and a judge, and
rollout time per step with the reward model colocated against in a pool of its own.

Throughput: the same ``--trajectories`` answers to the built-in single-digit-sum task (each
prompt's right answer or an answer off by one, alternately: what a half-trained policy writes)
are scored by each kind through ``RewardRouter``, in batches of ``--batch`` as a reward worker
scores them: the ``arith`` rule; the built-in tiny reward model (trained here for a few steps,
since throughput needs no accuracy, or ``--rm-path``) with configs/arith-rm-tiny.yaml's
settings; the tiny policy as a generative judge with configs/arith-judge-tiny.yaml's settings
(one decode per batch, its unparseable verdicts decoded again). Each router is built and scores
one batch before the clock starts (loading is not scoring); the figure is trajectories per
second and its ratio to the rule's, measured in this run.

Placement: two short sync runs of configs/arith-rm-tiny.yaml (no Prefect, no validation, no
checkpoints, in a temporary folder), alike but for ``reward.placement``: ``own_pool`` (the
baseline) and ``colocate``. The figures are seconds per step from metrics.jsonl: the generate
phase (``timing/generate``: the trainer's wait for its batch, whose generation mostly overlaps
the step before), the rollout engines' generating time (``rollout/busy_seconds``), the reward
phase (``timing/reward``) and the step; each the mean over the steps after the first
(start-up), and the ratio colocate / own_pool. On a CPU-only machine there is no device
to share: colocation costs only the reward model's sleep before and wake after each scoring
(its weights off and back), which is what this measures there; on a GPU machine
(``--device cuda``) the reward model shares a rollout replica's GPU as well.

    python -m rl_train.bench.reward                                  # defaults below, ~3 min
    python -m rl_train.bench.reward --trajectories 2048 --steps 8 --batch 16 --n 16
    python -m rl_train.bench.reward --skip placement --rm-path models/tiny-rm
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import yaml

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rl_train.engines.reward.base import Trajectory  # noqa: E402
from rl_train.engines.reward.config import RewardConfig  # noqa: E402
from rl_train.engines.reward.router import RewardRouter  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
RM_CONFIG = REPO / "configs" / "arith-rm-tiny.yaml"
JUDGE_CONFIG = REPO / "configs" / "arith-judge-tiny.yaml"
TASK = "single_digit_sum"
PLACEMENTS = ("own_pool", "colocate")
"""The baseline first."""
PHASES = {
    "generate": "timing/generate",
    "rollout busy": "rollout/busy_seconds",
    "reward": "timing/reward",
    "step": "timing/step",
}
"""Seconds per step: the trainer's wait for its batch (generation overlaps the step before: the
prefetch), the rollout engines' generating time, the reward phase, the whole step."""


@dataclass(frozen=True)
class Throughput:
    kind: str
    trajectories: int
    seconds: float
    load_seconds: float
    infra: int
    """Trajectories still infra after the router's retries (an unparseable verdict, for a judge)."""

    @property
    def per_second(self) -> float:
        return self.trajectories / self.seconds if self.seconds > 0 else float("inf")


def answers(count: int, seed: int = 0) -> list[Trajectory]:
    """``count`` single-turn answers to the task's prompts: right and off-by-one, alternately."""
    from rl_train.storage.builtin_data import BUILTIN_TASKS

    rows, _ = BUILTIN_TASKS.get(TASK)(seed=seed)
    out = []
    for i in range(count):
        row = rows[i % len(rows)]
        truth = int(row["ground_truth"])
        out.append(Trajectory.of_answer(row, str(truth if i % 2 == 0 else truth + 1)))
    return out


def _section(path: Path, kind: str) -> dict[str, Any]:
    """The ``reward:`` section of a shipped config, its one ``kind`` entry (models/judges)."""
    reward = yaml.safe_load(path.read_text(encoding="utf-8"))["reward"]
    ((name, entry),) = reward[kind].items()
    return {"name": name, **entry}


def reward_configs(policy: Path, rm_path: Path, device: str) -> dict[str, RewardConfig]:
    """The three kinds' ``reward:`` sections, each routing the task's data source to it."""
    rm = _section(RM_CONFIG, "models")
    judge = _section(JUDGE_CONFIG, "judges")
    rm_name, judge_name = rm.pop("name"), judge.pop("name")
    rm.update(path=str(rm_path), device=device)
    judge.update(model_path=str(policy), device=device)
    return {
        "rule": RewardConfig(by_data_source={"arith": "arith"}),
        "reward model": RewardConfig.model_validate(
            {"models": {rm_name: rm}, "by_data_source": {"arith": rm_name}}
        ),
        "judge": RewardConfig.model_validate(
            {"judges": {judge_name: judge}, "by_data_source": {"arith": judge_name}}
        ),
    }


def score_throughput(
    kind: str, config: RewardConfig, trajectories: Sequence[Trajectory], batch: int
) -> Throughput:
    """Build ``config``'s router, score one batch (warm-up), then time every batch."""
    began = time.perf_counter()
    router = RewardRouter(config)
    router.build_configured()
    router.score(trajectories[:batch])
    loaded = time.perf_counter() - began
    infra = 0
    began = time.perf_counter()
    for start in range(0, len(trajectories), batch):
        infra += sum(r.is_infra for r in router.score(trajectories[start : start + batch]))
    seconds = time.perf_counter() - began
    for name in router.settings.reward.names():
        close = getattr(router.reward(name), "close", None)
        if callable(close):
            close()
    return Throughput(kind, len(trajectories), seconds, loaded, infra)


def throughputs(policy: Path, rm_path: Path, count: int, batch: int, device: str = "cpu") -> list[Throughput]:
    """The rule's, the reward model's and the judge's throughput on the same answers."""
    trajectories = answers(count)
    return [
        score_throughput(kind, config, trajectories, batch)
        for kind, config in reward_configs(policy, rm_path, device).items()
    ]


def placement_overrides(
    workdir: Path, policy: Path, rm_path: Path, placement: str, steps: int, batch: int, n: int, device: str
) -> list[str]:
    """configs/arith-rm-tiny.yaml, shortened, its inputs in ``workdir``, at ``placement``."""
    return [
        f"model.path={policy}",
        f"data.data_dir={workdir / 'data'}",
        f"reward.models.tiny_rm.path={rm_path}",
        f"reward.models.tiny_rm.device={device}",
        f"reward.device={device}",
        f"reward.placement={placement}",
        f"run.name=reward-{placement}",
        f"run.output_dir={workdir / 'runs'}",
        f"trainer.total_steps={steps}",
        f"trainer.train_batch_size={batch}",
        f"rollout.n={n}",
        "trainer.use_prefect=false",
        "trainer.val_every_steps=0",
        "trainer.val_before_train=false",
        "checkpoint.every_steps=0",
    ]


def placement_times(
    workdir: Path, policy: Path, rm_path: Path, steps: int, batch: int, n: int, device: str = "cpu"
) -> dict[str, dict[str, float]]:
    """Per placement: each of ``PHASES``' mean seconds per step after the first."""
    from rl_train.config import load_config
    from rl_train.flows.base import prepare_inputs
    from rl_train.flows.train import run_training
    from rl_train.storage.metrics import read_metrics

    results = {}
    for placement in PLACEMENTS:
        config = load_config(
            RM_CONFIG, placement_overrides(workdir, policy, rm_path, placement, steps, batch, n, device)
        )
        prepare_inputs(config)
        rows = read_metrics(run_training(config)["run_dir"])
        later = rows[1:] or rows
        results[placement] = {label: mean(r.get(key, 0.0) for r in later) for label, key in PHASES.items()}
    return results


def report(scored: list[Throughput] | None, placed: dict[str, dict[str, float]] | None, device: str) -> None:
    """Print the two tables, each with its ratio to the baseline measured in this run."""
    if scored:
        rule = scored[0].per_second
        print(f"scoring throughput, {scored[0].trajectories} trajectories ({TASK}), through RewardRouter")
        print(f"{'kind':<14}{'traj/s':>10}{'ratio':>9}{'load s':>9}{'infra':>7}")
        for t in scored:
            print(
                f"{t.kind:<14}{t.per_second:>10.1f}{t.per_second / rule:>9.4f}{t.load_seconds:>9.2f}{t.infra:>7}"
            )
    if placed:
        base, other = (placed[p] for p in PLACEMENTS)
        where = (
            "CPU only: colocation is the reward model's sleep and wake around each scoring"
            if device == "cpu"
            else device
        )
        print(f"\nseconds per step (mean after the first), reward model {' vs '.join(PLACEMENTS)} ({where})")
        print(f"{'phase':<14}{PLACEMENTS[0]:>10}{PLACEMENTS[1]:>10}{'ratio':>8}")
        for label in PHASES:
            ratio = other[label] / base[label] if base[label] else float("nan")
            print(f"{label:<14}{base[label]:>10.3f}{other[label]:>10.3f}{ratio:>8.3f}")


def main(argv: list[str] | None = None) -> tuple[list[Throughput] | None, dict[str, dict[str, float]] | None]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=512, help="answers each kind scores (throughput)")
    parser.add_argument(
        "--batch", type=int, default=32, help="trajectories per router call; also the runs' train_batch_size"
    )
    parser.add_argument("--n", type=int, default=8, help="rollout.n of the placement runs")
    parser.add_argument(
        "--steps", type=int, default=4, help="steps of each placement run (the first is not counted)"
    )
    parser.add_argument(
        "--rm-steps", type=int, default=20, help="training steps of the tiny reward model made here"
    )
    parser.add_argument(
        "--rm-path", type=Path, default=None, help="a reward model to use instead of training one"
    )
    parser.add_argument(
        "--policy-steps", type=int, default=60, help="pretraining steps of the tiny policy made here"
    )
    parser.add_argument("--model-dir", type=Path, default=None, help="a policy (and judge) to use instead")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the reward model and judge run"
    )
    parser.add_argument(
        "--skip", choices=("throughput", "placement"), default=None, help="leave one part out"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlt-reward-bench-") as tmp:
        workdir = Path(tmp)
        policy, rm_path = inputs(workdir, args.model_dir, args.policy_steps, args.rm_path, args.rm_steps)
        scored: list[Throughput] | None = None
        placed: dict[str, dict[str, float]] | None = None
        if args.skip != "throughput":  # each table printed as soon as it is measured
            scored = throughputs(policy, rm_path, args.trajectories, args.batch, args.device)
            report(scored, None, args.device)
        if args.skip != "placement":
            placed = placement_times(workdir, policy, rm_path, args.steps, args.batch, args.n, args.device)
            report(None, placed, args.device)
    return scored, placed


def inputs(
    workdir: Path, model_dir: Path | None, policy_steps: int, rm_path: Path | None, rm_steps: int
) -> tuple[Path, Path]:
    """The policy (also the judge) and the reward model: those given, or the built-in tiny ones
    made in ``workdir`` (briefly trained: the figures measure cost, not accuracy)."""
    if model_dir is None:
        from rl_train.engines.model.tiny import create_tiny_policy

        model_dir = create_tiny_policy(workdir / "model", seed=0, pretrain_steps=policy_steps)
    if rm_path is None:
        from rl_train.engines.reward.tiny_rm import train_tiny_rm

        rm_path = train_tiny_rm(
            workdir / "rm", TASK, seed=0, steps=rm_steps, progress=lambda m: print(m, file=sys.stderr)
        ).out
    return Path(model_dir), Path(rm_path)


if __name__ == "__main__":
    main()
