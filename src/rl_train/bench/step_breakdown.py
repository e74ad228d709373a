"""Where a global step's time goes, and what Prefect costs on top of the phase functions.

Builds one run (model, Ray pools, data) and runs global steps in turns on the same pools, in
the same process, on up to three sides, then prints the mean time of each phase and each
Prefect side's ratio to the direct one:

- nested: each step a sub-flow run whose phases are task runs, nested in the bench's flow run
  as a training run's steps are in it (``trainer.step_layout: nested``; auto's choice on a
  Prefect server of the user's);
- flat: the phases task runs of the bench's flow run itself, named ``step-N/<phase>``
  (``trainer.step_layout: flat``; auto's choice on a run's own temporary API);
- direct: the same phase functions called directly.

Taking turns (nested, flat, direct, nested, ...) keeps drift on a noisy machine from favouring
any side. It also counts, per phase, the bytes that Ray hands back to this process (the
driver): a phase that moves records through the driver shows them there; one that passes only
batch ids shows a few hundred bytes.

    python -m rl_train.bench.step_breakdown                      # the demo config
    python -m rl_train.bench.step_breakdown --preset heavy       # a step of 5 s or more
    python -m rl_train.bench.step_breakdown --sides nested direct --steps 6 rollout.n=32
"""

from __future__ import annotations

import argparse
import contextvars
import pickle
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from rl_train.runtime import apply_local_defaults

apply_local_defaults()

from prefect import flow  # noqa: E402

from rl_train.config import load_config  # noqa: E402
from rl_train.flows.step import PhaseRunner  # noqa: E402
from rl_train.flows.train import build_trainer  # noqa: E402

_PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("phase", default="(between phases)")


def count_driver_bytes() -> Counter[str]:
    """Patch ``ray.get`` and ``PhaseRunner`` in this process so that the pickled size of every
    result Ray returns to the driver is added to the phase that asked for it."""
    import ray

    counts: Counter[str] = Counter()
    real_get: Callable[..., Any] = ray.get
    real_call = PhaseRunner.__call__

    def get(refs: Any, *args: Any, **kwargs: Any) -> Any:
        result = real_get(refs, *args, **kwargs)
        counts[_PHASE.get()] += len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result

    def call(self: PhaseRunner, phase: Any, *args: Any) -> Any:
        token = _PHASE.set(phase.name)
        try:
            return real_call(self, phase, *args)
        finally:
            _PHASE.reset(token)

    mock.patch.object(ray, "get", get).start()  # for the rest of this process
    mock.patch.object(PhaseRunner, "__call__", call).start()
    return counts


REPO = Path(__file__).resolve().parents[3]
PRESETS = {
    "demo": [],
    # Bigger batches and longer answers: a step of several seconds, where a fixed per-step
    # orchestration cost should vanish in the noise.
    "heavy": [
        "trainer.train_batch_size=192",
        "rollout.n=16",
        "rollout.max_new_tokens=8",
        "data.builtin_task=multi_digit_sum",
        "data.data_dir=data/multi_digit_sum",
    ],
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "configs" / "arith-tiny.yaml"))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    parser.add_argument("--steps", type=int, default=8, help="steps per side (after one warm-up step each)")
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=list(SIDES), help="which sides take turns (direct always does)"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = [
        *PRESETS[args.preset],
        "trainer.val_before_train=false",
        f"run.name=bench-steps-{time.strftime('%Y%m%d-%H%M%S')}",  # never reuse a run dir
        *args.overrides,
    ]
    config = load_config(args.config, overrides)
    sides = [side for side in SIDES if side in args.sides or side == "direct"]
    config.trainer.total_steps = len(sides) * (args.steps + 1)
    timings, driver_bytes = breakdown_flow(config, args.steps, sides)
    _report(timings, args.preset)
    _report_bytes(driver_bytes, len(sides) * args.steps)


SIDES = ("nested", "flat", "direct")


@flow(name="step-breakdown", validate_parameters=False)
def breakdown_flow(config: Any, steps: int, sides: list[str]) -> tuple[dict[str, list[dict[str, float]]], Counter[str]]:
    """The steps inside a flow run, as in a training run, the sides taking turns: the nested
    side's steps are this flow run's sub-flow runs, the flat side's phases its task runs."""
    trainer = build_trainer(config)
    trainer.init()
    timings: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    driver_bytes = count_driver_bytes()
    try:
        step = 0
        for round_no in range(steps + 1):
            for side in sides:
                step += 1
                started = time.perf_counter()
                trainer.config.trainer.use_prefect = side != "direct"
                trainer.config.trainer.step_layout = "flat" if side == "flat" else "nested"
                metrics = trainer.step(step)
                metrics["timing/step"] = time.perf_counter() - started
                if round_no > 0:  # the first round warms every side up
                    timings[side].append(metrics)
                else:
                    driver_bytes.clear()
    finally:
        trainer.teardown()
    return timings, driver_bytes


def _report_bytes(counts: Counter[str], steps: int) -> None:
    print(f"\nbytes returned to the driver per global step, by phase (mean of {steps} steps)")
    for phase, total in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"{phase:<24}{total / max(steps, 1):>14,.0f}")


def _report(timings: dict[str, list[dict[str, float]]], preset: str) -> None:
    direct = timings["direct"]
    others = [side for side in timings if side != "direct"]
    keys = sorted({k for m in direct for k in m if k.startswith("timing/") and "/weight_sync/" not in k})
    print(f"\nstep breakdown ({preset} preset, {len(direct)} steps per side), mean seconds")
    print(f"{'phase':<24}" + "".join(f"{side:>10}" for side in [*others, "direct"]) + "".join(f"{side + '/d':>10}" for side in others))
    for key in keys:
        d = statistics.mean(m.get(key, 0.0) for m in direct)
        means = [statistics.mean(m.get(key, 0.0) for m in timings[side]) for side in others]
        ratios = "".join(f"{(p / d if d else float('nan')):>10.2f}" for p in means)
        print(f"{key.removeprefix('timing/'):<24}" + "".join(f"{p:>10.3f}" for p in [*means, d]) + ratios)
    d = statistics.median(m["timing/step"] for m in direct)
    for side in others:
        p = statistics.median(m["timing/step"] for m in timings[side])
        print(f"median step: {side} {p:.3f} s, direct {d:.3f} s -> ratio {side}/direct = {p / d:.3f}")


if __name__ == "__main__":
    main()
