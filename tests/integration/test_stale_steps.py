"""A retried training run marks the step sub-flows its killed attempt left running as Crashed
(against Prefect's API; a real kill and retry is the slow served-run test)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.states import Completed, Running, State

from rl_train.flows.ui import end_stale_steps

pytestmark = pytest.mark.integration


@flow(name="rl-train-step")
def _step() -> None:
    """Stands in for a step sub-flow (only its runs are created here, never run)."""


@task(name="step")
def _step_task() -> None:
    """The parent task run Prefect puts between a flow run and its sub-flow."""


@task(name="update")
def _phase() -> None:
    """Stands in for a phase task run of the flat layout (created here, never run)."""


def _child(client: Any, parent: UUID, name: str, state: State) -> UUID:
    """A flow run under the training run, as a step sub-flow is: through a parent task run."""
    link = client.create_task_run(_step_task, flow_run_id=parent, dynamic_key=name, state=Running())
    child = client.create_flow_run(_step, name=name, parent_task_run_id=link.id)
    client.set_flow_run_state(child.id, state, force=True)
    return child.id


def test_a_resumed_run_ends_the_steps_its_killed_attempt_left_running(prefect_harness: None) -> None:
    @flow(name="rl-train-resumed")
    def resumed() -> dict[str, Any]:
        parent = FlowRunContext.get().flow_run.id
        with get_client(sync_client=True) as client:
            done = _child(client, parent, "run/step-3", Completed())
            stale = _child(client, parent, "run/step-4", Running())
            finished_phase = client.create_task_run(
                _phase, flow_run_id=parent, dynamic_key="3", name="step-3/update", state=Completed()
            )
            stale_phase = client.create_task_run(
                _phase, flow_run_id=parent, dynamic_key="4", name="step-4/update", state=Running()
            )
            ended = end_stale_steps(3)
            return {
                "ended": ended,
                "done": client.read_flow_run(done).state.type,
                "stale": client.read_flow_run(stale).state,
                "finished_phase": client.read_task_run(finished_phase.id).state.type,
                "stale_phase": client.read_task_run(stale_phase.id).state,
            }

    out = resumed()
    # the nested layout's sub-flow run, then the flat layout's phase task run of the training run
    assert out["ended"] == ["run/step-4", "step-4/update"]
    assert out["done"] == StateType.COMPLETED and out["stale"].type == StateType.CRASHED
    assert "resumed from checkpoint 3" in out["stale"].message
    assert out["finished_phase"] == StateType.COMPLETED
    assert out["stale_phase"].type == StateType.CRASHED and "checkpoint 3" in out["stale_phase"].message


def test_outside_a_flow_run_nothing_is_asked() -> None:
    assert end_stale_steps(5) == []
