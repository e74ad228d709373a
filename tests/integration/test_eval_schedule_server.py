"""A Prefect server creates the scheduled runs of the eval deployment (R-10.1).

The server's scheduler inserts a deployment's upcoming runs in bulk. Under SQLAlchemy 2.1 that
insert fails in Prefect 3.9 (a run's ``state`` meets 2.1's hybrid-property bulk check), so no
schedule ever fires; the project pins SQLAlchemy below 2.1. This asks the test server to
schedule runs of the deployment (the call its scheduler service makes on a loop) and reads
them back. The served run itself: tests/integration/test_evaluate.py (``slow``).
"""

from __future__ import annotations

from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

from rl_train.deployments.eval_schedule import EvalScheduleConfig, build_eval_deployment

pytestmark = pytest.mark.integration


def test_the_server_schedules_runs_of_the_eval_deployment(prefect_harness: Any) -> None:
    schedule = EvalScheduleConfig(run_dir="runs/nightly", interval_seconds=600)
    deployment_id = build_eval_deployment(schedule, "/srv/root").apply()
    with get_client(sync_client=True) as client:
        response = client.request(
            "POST", "/deployments/{id}/schedule", path_params={"id": deployment_id}, json={"min_runs": 3}
        )
        assert response.status_code < 300, response.text
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    assert len(runs) >= 3
    assert all(run.auto_scheduled and run.state is not None and run.state.is_scheduled() for run in runs)
    starts = sorted(run.expected_start_time for run in runs)
    assert {
        (later - earlier).total_seconds() for earlier, later in zip(starts[:-1], starts[1:], strict=True)
    } == {600.0}
    assert runs[0].parameters == {"run_dir": "runs/nightly", "extra_val_files": [], "root": "/srv/root"}
