"""gae (critic pool: values, critic_update) and remax (greedy_baseline) runs go through every phase.

Real Ray actors, the tiny policy, two global steps each: through Prefect (every phase a task
run) and with the phases called directly, in sync mode and in colocate_async (where the greedy
answers are generated while background rollout holds).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect_reads import recorded_task_names

from rl_train.config import Config
from rl_train.flows.train import run_training, train_flow
from rl_train.storage.metrics import read_metrics
from rl_train.tasks import CRITIC_PHASES, GREEDY_BASELINE_PHASES, PHASES

pytestmark = pytest.mark.integration

CRITIC_METRICS = (
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/values_mean",
    "critic/returns_mean",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "critic/lr",
)


def run_config(base: dict[str, Any], estimator: str, **sections: dict[str, Any]) -> Config:
    cfg = copy.deepcopy(base)
    cfg["trainer"].update(total_steps=2, val_every_steps=0)
    cfg["algorithm"] = {"adv_estimator": estimator}
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return Config.model_validate(cfg)


def assert_every_phase_ran(metrics: list[dict[str, Any]], phases: tuple[str, ...]) -> None:
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for phase in phases:
            assert m[f"timing/{phase}"] > 0, phase


def test_gae_through_prefect_runs_the_critic_phases_as_tasks(
    small_run_config: dict[str, Any], ray_local, prefect_harness
) -> None:
    config = run_config(small_run_config, "gae")
    state = train_flow(resolved=config.model_dump(mode="json"), return_state=True)
    assert state.is_completed(), state
    metrics = read_metrics(state.result()["run_dir"])
    assert_every_phase_ran(metrics, tuple(p for p in PHASES if p != "ref") + CRITIC_PHASES)
    for m in metrics:
        for key in CRITIC_METRICS:
            assert math.isfinite(m[key]), key
        assert "timing/greedy_baseline" not in m
    assert metrics[0]["critic/values_mean"] == 0.0  # the zero-initialised head, before any update
    # Step 1's critic update moves the head only if step 1 had a return to learn: where every
    # sampled answer of step 1 was wrong (which floating-point differences between CPUs decide
    # for this small batch), the returns are all zero, the value loss's gradient is zero and
    # the head stays at zero; otherwise step 2's values are no longer zero.
    if metrics[0]["critic/returns_mean"] != 0.0:
        assert metrics[1]["critic/values_mean"] != 0.0  # the critic has learned something
    else:
        assert metrics[1]["critic/values_mean"] == 0.0

    with get_client(sync_client=True) as client:
        parent = state.state_details.flow_run_id
        steps = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))
        )
        names = recorded_task_names(client, steps[0].id, CRITIC_PHASES)
        assert set(CRITIC_PHASES) <= names, names


def test_gae_without_prefect_on_two_critic_ranks(
    small_run_config: dict[str, Any], ray_local, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two critic DP ranks; a process that rejoins the run by id finds both (a retried task)."""
    from rl_train.engines.workers.pools import WorkerPools
    from rl_train.flows.sync import SyncTrainer

    rejoined: list[int] = []

    def on_train_begin(trainer: SyncTrainer) -> None:
        pools, _ = WorkerPools.join(trainer.run_id)
        rejoined.extend(ray_local.get([critic.ping.remote() for critic in pools.critic.ranks]))

    monkeypatch.setattr(SyncTrainer, "on_train_begin", on_train_begin)
    config = run_config(
        small_run_config, "gae", trainer={"use_prefect": False}, critic={"num_ranks": 2, "num_threads": 1}
    )
    metrics = read_metrics(run_training(config)["run_dir"])
    assert rejoined == [0, 1]
    assert_every_phase_ran(metrics, tuple(p for p in PHASES if p != "ref") + CRITIC_PHASES)
    assert all(math.isfinite(m[key]) for m in metrics for key in CRITIC_METRICS)


def test_remax_answers_greedily_for_its_baseline(small_run_config: dict[str, Any], ray_local) -> None:
    # colocate_async: the greedy answers are generated while background rollout holds.
    config = run_config(small_run_config, "remax", trainer={"use_prefect": False, "mode": "colocate_async"})
    metrics = read_metrics(run_training(config)["run_dir"])
    assert_every_phase_ran(metrics, tuple(p for p in PHASES if p != "ref") + GREEDY_BASELINE_PHASES)
    for m in metrics:
        assert 0.0 <= m["greedy_baseline/reward_mean"] <= 1.0
        assert math.isfinite(m["actor/loss"])
        assert not any(key.startswith("critic/") for key in m)  # remax trains no critic
