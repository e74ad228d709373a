"""The crash test's checks catch what they claim to: a repeated or lost prompt, a repeated or
missing step, a launch that resumed from the wrong or a torn checkpoint, a kill that tore a
write. Hand-made run directories and launch records, no run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_train.bench.crash_audit import AuditResult, ledger_problems, metrics_problems, resume_problems
from rl_train.bench.crash_life import Life
from rl_train.bench.crash_trigger import Cue, Estimates, KillTrigger
from rl_train.flows.resume import LEDGER_FILE
from rl_train.storage.dataset import PromptLoader, load_prompts

NUM_PROMPTS = 6
BATCH = 3


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    rows = [
        {"prompt": f"{i}+1=", "data_source": "arith/single_digit_sum", "ground_truth": str(i + 1)}
        for i in range(NUM_PROMPTS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run_dir(tmp_path: Path, mode: str, ledger: list[list[int]]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = {
        "run": {"seed": 0},
        "trainer": {"mode": mode, "total_steps": len(ledger), "train_batch_size": BATCH},
        "replay": {"prefetch_batches": 1},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": k + 1, "groups": [f"p{i}" for i in groups]} for k, groups in enumerate(ledger)]
    (run_dir / LEDGER_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": k + 1}) + "\n" for k in range(len(ledger)))
    )
    return run_dir


def _audit(run_dir: Path, train_file: Path) -> tuple[list[str], AuditResult]:
    result = AuditResult()
    return ledger_problems(run_dir, train_file, result), result


def test_a_clean_sync_ledger_passes_and_covers_its_epochs(tmp_path: Path, train_file: Path) -> None:
    problems, result = _audit(
        _run_dir(tmp_path, "sync", [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]), train_file
    )
    assert problems == []
    assert (result.covered_epochs, result.num_trained) == (2, 12)  # 12 draws of 6 prompts


def test_a_prompt_trained_twice_is_caught(tmp_path: Path, train_file: Path) -> None:
    # p1 again in step 2 instead of p5: p1 twice, p5 (and so one row of epoch 0) never
    problems, _ = _audit(
        _run_dir(tmp_path, "sync", [[0, 1, 2], [3, 4, 1], [6, 7, 8], [9, 10, 11]]), train_file
    )
    assert any("p1 trained more than once: in steps [1, 2]" in p for p in problems), problems
    assert any("lost" in p and "[5]" in p for p in problems), problems


def test_sync_may_not_leave_a_draw_untrained(tmp_path: Path, train_file: Path) -> None:
    problems, _ = _audit(
        _run_dir(tmp_path, "sync", [[0, 1, 2], [3, 4, 6], [7, 8, 9], [10, 11, 12]]), train_file
    )
    assert any("[5]" in p for p in problems), problems  # sync draws exactly what it trains


def test_async_may_leave_its_last_draws_in_flight_but_not_an_old_one(
    tmp_path: Path, train_file: Path
) -> None:
    # up to (prefetch_batches + 1) x batch = 6 draws in flight: p14 untrained at the end is fine
    ledger = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 15]]
    problems, result = _audit(_run_dir(tmp_path, "colocate_async", ledger), train_file)
    assert problems == [] and result.untrained_draws == [14] and result.covered_epochs == 2
    # p2 never trained, long before the end: lost, although one draw is within the bound
    lost = tmp_path / "lost"
    lost.mkdir()
    ledger = [[0, 1, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15]]
    problems, _ = _audit(_run_dir(lost, "colocate_async", ledger), train_file)
    assert any("lost" in p and "[2]" in p for p in problems), problems


def test_every_covered_epoch_is_checked_in_prompts_not_only_in_draws(train_file: Path) -> None:
    prompts = load_prompts([train_file])
    rows = {
        PromptLoader(prompts, seed=0, position=i).next()[1]["prompt"]
        for i in range(NUM_PROMPTS, 2 * NUM_PROMPTS)
    }
    assert len(rows) == NUM_PROMPTS  # epoch 1's draws are each train row once, in a shuffled order


def test_metrics_with_a_repeated_step_fail(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in [1, 2, 2, 3]))
    assert metrics_problems(tmp_path, 3) == [
        "metrics.jsonl steps are not 1..3 once each: repeated [2], missing []"
    ]
    assert metrics_problems(tmp_path, 4)[0].endswith("repeated [2], missing [4]")


def _life(index: int, expected: int, lines: list[str], **fields: Any) -> Life:
    return Life(index, "random", expected, lines=[(0.1 * i, line) for i, line in enumerate(lines)], **fields)


def _resume_line(step: int) -> str:
    return f"resuming /r from checkpoint /r/checkpoints/step-{step:08d}: step {step + 1} is next, 0 prompt group(s) ..."


def test_resume_from_an_older_or_a_torn_checkpoint_is_caught() -> None:
    first = _life(
        0, 0, ["step    1/9 | x", "step    2/9 | x"], killed_at=5.0, torn_after={3: 1.0}, launched_at=0.5
    )
    ok = _life(1, 2, [_resume_line(2), "step    3/9 | x"])
    assert resume_problems([first, ok], AuditResult()) == []
    older = _life(1, 2, [_resume_line(1), "step    2/9 | x"])
    assert resume_problems([first, older], AuditResult()) == [
        "launch 1 resumed from checkpoint 1; the newest complete one was 2"
    ]
    torn = _life(1, 2, [_resume_line(3), "step    4/9 | x"])
    problems = resume_problems([first, torn], AuditResult())
    assert "launch 1 loaded checkpoint 3, a folder torn by the kill before it" in problems
    over = _life(1, 2, ["step    1/9 | x"])
    assert resume_problems([first, over], AuditResult()) == [
        "launch 1 started over although checkpoint 2 was complete"
    ]


def test_a_torn_write_counts_only_if_this_launch_wrote_into_the_folder() -> None:
    lines = ["crash-probe: ckpt-begin 4", "crash-probe: ckpt-end 4", "crash-probe: ckpt-begin 5"]
    assert _life(2, 3, lines, killed_at=9.0, launched_at=100.0, torn_after={5: 101.0}).torn_writes() == [5]
    # the folder of step 5 was torn by an earlier launch and not touched since
    assert _life(2, 3, lines, killed_at=9.0, launched_at=100.0, torn_after={5: 99.0}).torn_writes() == []
    sync = _life(2, 3, ["crash-probe: sync-begin 6", "crash-probe: sync-end 6", "crash-probe: sync-begin 7"])
    assert sync.open_syncs() == [7]


def test_aimed_triggers_arm_only_after_a_commit_of_their_own(tmp_path: Path) -> None:
    rng, estimates = random.Random(0), Estimates()
    checkpoint = KillTrigger("checkpoint", rng, estimates, tmp_path)
    assert checkpoint.on_line("crash-probe: ckpt-begin 3") is None  # nothing committed by this launch yet
    assert checkpoint.on_line("crash-probe: ckpt-end 3") is None
    cue = checkpoint.on_line("crash-probe: ckpt-begin 4")
    assert cue is not None and cue.folder == tmp_path / "step-00000004" and 1 <= cue.min_parts <= 12
    sync = KillTrigger("sync", rng, estimates, tmp_path)
    assert sync.on_line("crash-probe: sync-begin 3") is None
    sync.on_line("crash-probe: ckpt-end 3")
    assert sync.on_line("crash-probe: sync-begin 4") == Cue()
