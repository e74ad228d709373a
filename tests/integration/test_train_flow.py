"""Three global steps through real Prefect (test harness API) and real Ray actors."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect_reads import recorded_task_names, recorded_task_run_names

from rl_train.config import Config, apply_mode_defaults
from rl_train.flows.train import train_flow
from rl_train.storage.metrics import read_metrics
from rl_train.tasks import PHASES

pytestmark = pytest.mark.integration


def test_three_global_steps_through_prefect_and_ray(
    small_run_config: dict[str, Any], ray_local, prefect_harness
) -> None:
    cfg = copy.deepcopy(small_run_config)
    cfg["actor"]["num_ranks"] = 2  # two DP ranks joined by gloo inside Ray actors
    cfg["actor"]["kl_loss"] = True
    cfg["actor"]["kl_loss_coef"] = 0.01
    config = Config.model_validate(cfg)
    state = train_flow(resolved=config.model_dump(mode="json"), return_state=True)
    assert state.is_completed(), state
    summary = state.result()
    assert summary["steps"] == 3

    metrics = read_metrics(summary["run_dir"])
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        for key in ("reward/mean", "response_length/mean", "actor/loss", "actor/grad_norm", "actor/kl"):
            assert key in m, key
        for phase in PHASES:
            assert m[f"timing/{phase}"] > 0, phase
        assert 0.0 <= m["reward/mean"] <= 1.0
    assert "val/reward_mean" in metrics[-1]

    with get_client(sync_client=True) as client:
        parent = state.state_details.flow_run_id
        steps = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))
        )
        assert sorted(r.name for r in steps) == ["it/step-1", "it/step-2", "it/step-3"]  # <run.name>/step-N
        assert all(r.state.is_completed() for r in steps)
        names = recorded_task_names(client, steps[0].id, PHASES)
        assert set(PHASES) <= names, names


@pytest.mark.parametrize("mode", ["sync", "separate_async"])
def test_flat_layout_runs_the_phases_as_task_runs_of_the_training_run(
    small_run_config: dict[str, Any], ray_local, prefect_harness, mode: str
) -> None:
    """``trainer.step_layout: flat``: no flow run per step; every phase of every step is a task
    run of the training flow run, named ``step-N/<phase>`` (separate_async: its weight push
    too, and its local updates' phases under their step's name)."""
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(mode=mode, total_steps=2, step_layout="flat")
    apply_mode_defaults(cfg)
    config = Config.model_validate(cfg)
    state = train_flow(resolved=config.model_dump(mode="json"), return_state=True)
    assert state.is_completed(), state
    metrics = read_metrics(state.result()["run_dir"])
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m[f"timing/{phase}"] > 0 for m in metrics for phase in PHASES if phase != "ref")
    with get_client(sync_client=True) as client:
        parent = state.state_details.flow_run_id
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))
        )
        assert subflows == []
        expected = {f"step-{n}/{phase}" for n in (1, 2) for phase in PHASES if phase != "ref"}
        names = recorded_task_run_names(client, parent, expected)
        assert expected <= names, sorted(names)


@pytest.mark.parametrize("backend", ["bucketed", "delta"])
def test_sync_run_without_prefect_over_streaming_weight_sync(
    small_run_config: dict[str, Any], ray_local, backend: str
) -> None:
    """Same phases called directly; weights reach two rollout replicas over shared memory; the
    DAPO filter scores groups on the reward pool and refills them (the policy starts near 0.05
    reward, so most groups of 4 are all wrong: no gradient)."""
    from rl_train.flows.train import run_training

    cfg = copy.deepcopy(small_run_config)
    # delta: two local updates per global step (rollout wakes again for the second sample)
    cfg["trainer"].update(
        use_prefect=False, total_steps=2, parameter_sync_step=2 if backend == "delta" else 1
    )
    cfg["replay"] = {"filter_groups": True}
    cfg["rollout"].update(
        num_replicas=2, weight_sync={"backend": backend, "transport": "shm", "bucket_size_bytes": 1 << 16}
    )
    summary = run_training(Config.model_validate(cfg))
    metrics = read_metrics(summary["run_dir"])
    assert len(metrics) == 2 and all(f"timing/{p}" in metrics[0] for p in PHASES if p != "ref")
    assert metrics[-1]["weight_sync/bytes"] > 0
    assert metrics[0]["replay/evicted_filter"] > 0 and metrics[0]["replay/refill"] > 0
    assert metrics[0]["reward/mean"] > 0  # every trained group has a right answer (or fills a shortfall)
    for boundary in ("quiesce", "export", "transport", "receive", "recover"):
        assert f"timing/weight_sync/{boundary}" in metrics[-1]
    if backend == "delta":  # step 2's sync is a delta, written in place by the built-in engine
        assert 0 < metrics[-1]["weight_sync/delta_bytes"] == metrics[-1]["weight_sync/bytes"]
        assert metrics[-1]["weight_sync/full_resync"] == 0.0
