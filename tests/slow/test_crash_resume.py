"""Crash test of resume (R-9.3): each mode's run is killed with SIGKILL at least 20 times, in
checkpoint writes, in weight syncs and at random moments, and re-run each time until it ends.

It must lose and repeat nothing: every prompt of the covered epochs trained exactly once per
epoch, ``metrics.jsonl`` with steps 1..N once each, every launch resumed from the newest
checkpoint that verified before it (never a folder a kill tore), no process of a killed run
left alive and no shared memory left behind. Sync mode, seeded, must end with the very
weights of a run never killed. The harness is ``rl_train.bench.crash_harness`` (runnable on
its own); each of the 21 or so launches per mode pays Ray's and the workers' start-up (20 to
90 s on a busy two-core machine: 10 to 23 minutes per mode, an hour in all), so ``-m slow``.
``RL_TRAIN_CRASH_KILLS`` lowers the kill count for a quick look (the claim is about 20).

``.ci/run`` runs the short form on every change: sync mode killed at least 5 times in a
32-step run, held to every check above and ending bitwise equal to a run never killed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_train.bench.crash_harness import (
    MODES,
    CrashInputs,
    CrashReport,
    CrashSettings,
    CrashTest,
    prepare_inputs,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]

NUM_KILLS = int(os.environ.get("RL_TRAIN_CRASH_KILLS", "20"))
CI_KILLS, CI_TOTAL_STEPS = 5, 32
"""The short form: start-up is most of a launch's cost (some 20 s), a step a second or less, so
the run is cut to the steps its kills need and keeps its kills. Each aimed kill costs the run a
step or two; the random one is placed by a timer, after as many steps as fit in it (7 on a
loaded machine, in a run whose 5 kills took 12 steps in all). 32 steps leave room for all five
before the run can end (a run that ends first fails the test), and cover 10 epochs of the 24
prompts."""
_reports: dict[str, CrashReport] = {}


@pytest.fixture(scope="module")
def crash_inputs(tmp_path_factory: pytest.TempPathFactory) -> CrashInputs:
    return prepare_inputs(tmp_path_factory.mktemp("crash-inputs"), num_prompts=24)


def _report(mode: str, inputs: CrashInputs, tmp_path_factory: pytest.TempPathFactory) -> CrashReport:
    """One crash test per mode for the whole module: each assertion below reads the same run."""
    if mode not in _reports:
        settings = CrashSettings(mode, num_kills=NUM_KILLS, seed=0)
        _reports[mode] = CrashTest(settings, inputs, tmp_path_factory.mktemp(f"crash-{mode}")).run()
        print(_reports[mode].summary())
    return _reports[mode]


@pytest.fixture(scope="module", params=MODES)
def report(
    request: pytest.FixtureRequest, crash_inputs: CrashInputs, tmp_path_factory: pytest.TempPathFactory
) -> CrashReport:
    return _report(request.param, crash_inputs, tmp_path_factory)


def test_kills_land_in_checkpoint_writes_and_weight_syncs(report: CrashReport) -> None:
    assert len(report.killed) >= NUM_KILLS, report.summary()
    # proven, not aimed: a kill counts only if it left a step folder without a manifest ...
    assert report.checkpoint_write_kills(), report.summary()
    # ... or came while a push was out, begun and never seen to end
    assert report.weight_sync_kills(), report.summary()


def test_every_prompt_of_the_covered_epochs_is_trained_once_and_every_step_logged_once(
    report: CrashReport,
) -> None:
    assert report.audit.step_problems == [], report.summary()
    assert report.audit.covered_epochs >= 2
    settings = report.settings
    assert report.audit.num_trained == settings.total_steps * settings.train_batch_size  # full batches


def test_every_launch_resumes_from_the_newest_complete_checkpoint_never_a_torn_one(
    report: CrashReport,
) -> None:
    assert report.audit.resume_problems == [], report.summary()
    assert report.audit.loaded_steps, "no launch resumed from a checkpoint"
    for index, step in report.audit.loaded_steps:
        before = report.lives[index - 1]  # the launch the kill ended, and what it left
        assert step in before.committed_after and step not in before.torn_after, (index, step)
        assert report.lives[index].expected_problems == [], report.lives[index].expected_problems
    assert any(life.torn_after for life in report.lives), "no kill left a torn checkpoint folder"
    assert all(problems == [] for problems in report.verified_at_end.values()), report.verified_at_end


def test_a_killed_run_leaves_no_process(report: CrashReport) -> None:
    assert report.survivors() == [], report.summary()


def test_a_killed_run_leaves_no_shared_memory(report: CrashReport) -> None:
    """A killed launch cannot unlink its weight-sync segments (separate_async's shm buckets);
    the next launch's sender removes those of dead senders, so none outlive the run."""
    assert report.shm_left == [], report.summary()


def test_sync_after_the_kills_ends_bitwise_equal_to_an_uninterrupted_run(
    crash_inputs: CrashInputs, tmp_path_factory: pytest.TempPathFactory
) -> None:
    report = _report("sync", crash_inputs, tmp_path_factory)
    assert report.baseline_run_dir is not None
    assert Path(report.baseline_run_dir, "policy", "model.safetensors").exists()
    assert report.baseline_problems == [], report.summary()


@pytest.mark.timeout(1800)  # 5 kills: 7 launches (Ray, pools and all) with the uninterrupted run
def test_sync_killed_5_times_ends_bitwise_equal_to_an_uninterrupted_run(
    crash_inputs: CrashInputs, tmp_path: Path
) -> None:
    """The short form ``.ci/run`` runs: every check of this module, on one sync run."""
    settings = CrashSettings("sync", num_kills=CI_KILLS, seed=0, total_steps=CI_TOTAL_STEPS)
    report = CrashTest(settings, crash_inputs, tmp_path).run()
    print(report.summary())
    assert len(report.killed) >= CI_KILLS, report.summary()
    assert report.checkpoint_write_kills() and report.weight_sync_kills(), report.summary()
    assert any(life.torn_after for life in report.lives), "no kill left a torn checkpoint folder"
    assert report.audit.loaded_steps, "no launch resumed from a checkpoint"
    assert report.audit.num_trained == CI_TOTAL_STEPS * settings.train_batch_size
    assert report.baseline_run_dir is not None
    assert Path(report.baseline_run_dir, "policy", "model.safetensors").exists()
    # each step and prompt once, every resume from the newest whole checkpoint, no process and
    # no shared memory left, every checkpoint verifying, final weights and ledger bitwise equal
    assert report.problems() == [], report.summary()
