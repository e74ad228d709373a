"""A failed served run, retried through Prefect's API, resumes from storage (R-10.2, R-9.3).

``rl-train/sync`` is run by ``rl-train serve`` against a real local Prefect server and fails on
purpose at step 3 (its replay sampler raises there the first time). The retry is what
``prefect flow-run retry <id>`` (or the UI's Retry button) does: the flow run is set back to
Scheduled, and serve runs the *same* flow run again in a new process. That process finds the
run directory of this flow run, resumes from checkpoint 2, and trains steps 3 and 4 only.
The killed-and-Crashed run's retry: ``test_served_runs.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from serve_fixture import (
    assert_every_step_once,
    kill_marked,
    resume_lines,
    retry_flow_run,
    rows,
    start_serve,
    step_lines,
    step_runs,
    wait_for,
    write_gate_sampler,
)

pytestmark = pytest.mark.integration

TOTAL_STEPS = 4
GROUPS_PER_STEP = 8
"""``trainer.train_batch_size`` of the serve root's config: prompt groups per step."""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two runs' start-up (Ray, pools) on a loaded machine
def test_a_failed_served_run_retried_through_the_api_resumes_from_its_checkpoint(
    prefect_server: dict[str, str], serve_root: Path, tmp_path: Path
) -> None:
    sampler, failed_once = write_gate_sampler(serve_root, step=3)
    overrides = [
        f"replay.sampler={sampler}",
        "checkpoint.every_steps=1",
        f"trainer.total_steps={TOTAL_STEPS}",
    ]
    marker = uuid.uuid4().hex
    log = tmp_path / "serve.log"
    pythonpath = os.pathsep.join(filter(None, [str(serve_root), os.environ.get("PYTHONPATH")]))
    serve = start_serve(prefect_server, serve_root, log, marker, PYTHONPATH=pythonpath)
    started = time.time()
    try:
        run = run_deployment(
            "rl-train/sync", parameters={"config": "run.yaml", "overrides": overrides}, timeout=600
        )
        assert run.state.is_failed(), f"{run.state}\n{log.read_text()[-4000:]}"
        assert failed_once.exists() and "stopped on purpose at step 3" in run.state.message
        run_dir = serve_root / "runs" / f"sync-{run.name}-{run.id.hex[:8]}"
        assert [row["step"] for row in rows(run_dir / "metrics.jsonl")] == [1, 2]
        failed_after = time.time() - started
        with get_client(sync_client=True) as client:
            retry_flow_run(client, run.id)
            retried = time.time()
            state = wait_for(
                lambda: (s := client.read_flow_run(run.id).state).is_final() and s,
                600,
                "the retry to end",
                serve,
            )
            again = client.read_flow_run(run.id)
            lines = wait_for(
                lambda: (ls := step_lines(client, run.id)) and len(ls) >= TOTAL_STEPS and ls,
                30,
                "the step lines",
            )
            steps = step_runs(client, run.id)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        kill_marked(marker)
    print(
        f"the first try failed {failed_after:.0f} s after serve started; the retry ended {time.time() - retried:.0f} s after it"
    )
    assert state.is_completed(), f"{state}\n{log.read_text()[-4000:]}"
    assert again.run_count == 2 and again.name == run.name

    assert sorted(p.name for p in (serve_root / "runs").iterdir()) == [run_dir.name]  # the same directory
    assert_every_step_once(run_dir, TOTAL_STEPS, GROUPS_PER_STEP)
    # The retry said where it resumed (in serve's output: its runs' stderr), and its page holds
    # the step lines of both tries, each step once: the retry started at step 3.
    assert resume_lines(log) == [
        f"resuming {run_dir} from checkpoint {run_dir}/checkpoints/step-00000002: "
        "step 3 is next, 0 prompt group(s) in flight go back to rollout"
    ]
    assert lines == [f"step    {k}/{TOTAL_STEPS}" for k in range(1, TOTAL_STEPS + 1)]

    # The page: steps 1-2 of the first try still Completed, its step 3 Failed, then the
    # retry's steps 3 and 4 Completed.
    states = [(s.name.rsplit("/", 1)[-1], s.state.type.value) for s in steps]
    assert states == [
        ("step-1", "COMPLETED"),
        ("step-2", "COMPLETED"),
        ("step-3", "FAILED"),
        ("step-3", "COMPLETED"),
        ("step-4", "COMPLETED"),
    ], states
