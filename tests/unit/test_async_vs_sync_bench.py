"""The async-vs-sync bench gives every mode the same work on the real tool loop, with the same
heavy-tailed tool latency, and reports ratios to sync (throughput and time to reward)."""

from __future__ import annotations

import argparse

import pytest

from rl_train.bench.async_vs_sync import MODES, REPO, first_reaching, format_table, mode_overrides
from rl_train.bench.convergence import VARIANTS
from rl_train.config import load_config

ARGS = argparse.Namespace(
    steps=5,
    batch=32,
    n=8,
    parameter_sync_step=4,
    median_seconds=0.1,
    sigma=1.4,
    prefect=False,
    output_dir="/tmp/x",
    batches_in_flight=2,
)


def test_each_mode_loads_with_the_same_work_and_the_same_tail() -> None:
    configs = {m: load_config(REPO / "configs" / "tool-tiny.yaml", mode_overrides(m, ARGS)) for m in MODES}
    for mode, c in configs.items():
        assert c.trainer.mode == mode
        samples = c.trainer.total_steps * c.trainer.train_batch_size * c.rollout.n
        assert samples == 5 * 32 * 8  # the same trained samples
        optimizer_steps = c.trainer.parameter_sync_step * (
            c.trainer.train_batch_size // c.trainer.parameter_sync_step // c.actor.ppo_mini_batch_size
        )
        assert optimizer_steps == 4  # the same updates per global step
        # the real tool loop's calls wait the heavy-tailed delay; the old simulator stays off
        assert c.rollout.agent.tool_latency_median_s == 0.1 and c.rollout.agent.tool_latency_sigma == 1.4
        assert c.rollout.tool_env.name == "none"
        assert c.data.builtin_task == "tool_sum"
        assert c.rollout.num_replicas == 1  # separate_async too: one replica unless asked
        # the same loops in every async mode, split over its replicas
        assert c.rollout.agent.batches_in_flight == (1 if mode == "sync" else 2)
    assert configs["separate_async"].trainer.parameter_sync_step == 4
    assert configs["separate_async"].replay.prefetch_batches == 4  # one global batch beyond the one trained
    given = load_config(REPO / "configs" / "tool-tiny.yaml", mode_overrides("separate_async", argparse.Namespace(**{**vars(ARGS), "prefetch_batches": 3})))
    assert given.replay.prefetch_batches == 3
    four = load_config(REPO / "configs" / "tool-tiny.yaml", mode_overrides("separate_async", argparse.Namespace(**{**vars(ARGS), "rollout_replicas": 2, "batches_in_flight": 8})))
    assert four.rollout.num_replicas == 2 and four.rollout.agent.batches_in_flight == 4  # the loops split over them
    assert configs["separate_async"].rollout.weight_sync.backend == "bucketed"


def test_table_reports_ratios_to_sync_from_the_same_run() -> None:
    def row(mode: str, rate: float) -> dict[str, object]:
        return {
            "mode": mode,
            "seconds": 10.0,
            "samples_per_second": rate,
            "staleness_mean": 0.5,
            "staleness_max": 1.0,
            "evicted": {"staleness": 2.0, "filter": 0.0, "failure": 0.0},
            "rescues": 0.0,
            "rollout_idle": 0.5,
            "trainer_wait_s": 1.0,
            "reward_first": 0.1,
            "reward_last": 0.2,
            "steps_to_target": {"sync": 12, "colocate_async": None, "separate_async": 10}[mode],
            "seconds_to_target": {"sync": 60.0, "colocate_async": None, "separate_async": 24.0}[mode],
        }

    table = format_table([row("sync", 10.0), row("colocate_async", 15.0), row("separate_async", 27.5)])
    lines = table.splitlines()
    assert "| sync | 10.0 | 10.0 | 1.00x |" in lines[2] and lines[2].endswith("| 60.0 (step 12) | 1.00x |")
    assert "| colocate_async | 10.0 | 15.0 | 1.50x |" in lines[3] and lines[3].endswith("| not reached | - |")
    assert "| separate_async | 10.0 | 27.5 | 2.75x |" in lines[4] and lines[4].endswith("| 24.0 (step 10) | 2.50x |")


def test_time_to_reward_is_the_first_full_window_at_the_target() -> None:
    # windows of 3: (0.8+0.9+0.9)/3 = 0.867 < 0.9 at step 3; (0.9+0.9+1.0)/3 = 0.933 at step 4
    assert first_reaching([0.8, 0.9, 0.9, 1.0, 0.0], 0.9, 3) == 4
    assert first_reaching([1.0, 1.0], 0.9, 3) is None  # no full window yet


@pytest.mark.parametrize("variant", ["colocate_async", "separate_async"])
def test_convergence_bench_mode_variants_load(variant: str) -> None:
    config = load_config(REPO / "configs" / "arith-tiny.yaml", VARIANTS[variant])
    assert config.trainer.mode == variant


def test_the_phase_table_gives_median_seconds_from_the_third_step() -> None:
    from rl_train.bench.async_vs_sync import format_phases, phase_medians

    history = [{"timing/step": 9.0, "timing/update": 5.0}] * 2 + [
        {"timing/step": s, "timing/update": u, "rollout/busy_seconds": 1.0} for s, u in [(4.0, 2.0), (3.0, 1.0), (5.0, 3.0)]
    ]
    phases = phase_medians(history)
    assert phases == {"timing/step": 4.0, "timing/update": 2.0, "rollout/busy_seconds": 1.0}
    table = format_phases([{"mode": "sync", "phases": phases}])
    assert table.splitlines()[0].startswith("| mode | step | generate | old_log_prob | ref | update |")
    assert table.splitlines()[2] == "| sync | 4.00 | - | - | - | 2.00 | - | 1.00 |"


def test_the_seed_table_gives_each_seeds_ratio_to_its_own_sync_and_their_median() -> None:
    from rl_train.bench.async_vs_sync import format_seeds

    def row(seed: int, mode: str, seconds: float | None, steps: int | None) -> dict[str, object]:
        return {"seed": seed, "mode": mode, "seconds_to_target": seconds, "steps_to_target": steps}

    rows = [
        row(0, "sync", 200.0, 30), row(0, "separate_async", 100.0, 40),
        row(1, "sync", 300.0, 50), row(1, "separate_async", 100.0, 45),
        row(2, "sync", 240.0, 40), row(2, "separate_async", 200.0, 60),
        row(3, "sync", None, None), row(3, "separate_async", 90.0, 30),
    ]  # fmt: skip
    lines = format_seeds(rows).splitlines()
    assert lines[0] == "| seed | sync | separate_async |"
    assert lines[2] == "| 0 | 200.0 s (step 30), 1.00x | 100.0 s (step 40), 2.00x |"
    assert lines[3] == "| 1 | 300.0 s (step 50), 1.00x | 100.0 s (step 45), 3.00x |"
    assert lines[5] == "| 3 | not reached | 90.0 s (step 30) |"  # no sync to compare with
    # the median of 2.00, 3.00 and 1.20 (seed 3 has no ratio)
    assert lines[-1] == (
        "separate_async: median 2.00x, 1.20-3.00x sooner than sync to a 10-step mean of 0.9 over 4 seeds "
        "(1 without a ratio)"
    )


def test_seeds_are_one_comma_separated_argument_so_overrides_after_them_stay_overrides() -> None:
    from rl_train.bench.async_vs_sync import seed_list

    assert seed_list("0,1, 2") == [0, 1, 2]
    for bad in ("a,1", ",", "actor.lr=0.1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--seeds"):
            seed_list(bad)
