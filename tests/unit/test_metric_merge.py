"""A global step reports on every local update's groups, not only the last's."""

from __future__ import annotations

from typing import Any

import pytest

from rl_train.flows.metric_merge import combiner, merge_local_updates


def test_one_local_update_is_the_step() -> None:
    part = {"reward/mean": 0.5, "agent/trajectories": 64.0}
    merged = merge_local_updates([part])
    assert merged == part
    assert merged is not part


def test_four_quarters_make_the_step() -> None:
    parts = [
        {
            "reward/mean": reward,
            "reward/max": top,
            "rollout_corr/rollout_is_min": low,
            "agent/trajectories": 64.0,
            "agent/tool_calls/calculator": calls,
            "actor/nonfinite_steps": skipped,
            "actor/nonfinite_steps_in_row": in_row,
            "actor/lr": lr,
            "actor/loss": loss,
        }
        for reward, top, low, calls, skipped, in_row, lr, loss in [
            (0.25, 1.0, 0.9, 60.0, 0.0, 0.0, 1e-4, 0.1),
            (0.5, 0.75, 0.7, 62.0, 1.0, 1.0, 2e-4, 0.2),
            (0.75, 1.0, 0.8, 64.0, 1.0, 2.0, 3e-4, 0.3),
            (1.0, 1.0, 0.95, 64.0, 0.0, 0.0, 4e-4, 0.4),
        ]
    ]
    merged = merge_local_updates(parts)
    assert merged["reward/mean"] == pytest.approx(0.625)  # all 32 groups, not the last 8 (1.0)
    assert merged["reward/max"] == 1.0
    assert merged["rollout_corr/rollout_is_min"] == 0.7
    assert merged["agent/trajectories"] == 256.0
    assert merged["agent/tool_calls/calculator"] == 250.0
    assert merged["actor/nonfinite_steps"] == 2.0
    assert merged["actor/nonfinite_steps_in_row"] == 0.0  # the state at the step's end
    assert merged["actor/lr"] == 4e-4
    assert merged["actor/loss"] == pytest.approx(0.25)
    assert list(merged) == list(parts[0])


def test_a_key_some_updates_lack_averages_over_those_that_have_it() -> None:
    merged = merge_local_updates([{"critic/vf_loss": 2.0}, {}, {"critic/vf_loss": 4.0}])
    assert merged == {"critic/vf_loss": 3.0}


@pytest.mark.parametrize(
    ("key", "values", "expected"),
    [
        ("agent/tool_errors/<malformed>", [1.0, 2.0], 3.0),
        ("agent/tool_errors_mean", [0.25, 0.75], 0.5),
        ("rollout_corr/rollout_is_max", [1.5, 3.0], 3.0),
        ("critic/lr", [1.0, 2.0], 2.0),
        ("actor/router_replay_tokens", [10.0, 20.0], 30.0),
        ("balance/max_rank_tokens", [100.0, 300.0], 200.0),
        ("teacher/scored", [16.0, 16.0, 8.0, 16.0], 56.0),
        ("teacher/found_scored", [0.0, 8.0], 8.0),
        ("teacher/infra", [1.0, 0.0, 2.0], 3.0),
        ("teacher/streamed_groups", [4.0, 3.0], 7.0),
        ("teacher/seconds", [0.5, 1.5], 1.0),
    ],
)
def test_each_kind_of_key(key: str, values: list[float], expected: float) -> None:
    assert combiner(key)(values) == pytest.approx(expected)


def test_a_global_step_reports_every_local_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_global_step`` with four local updates: the step's reward is the mean of the four
    batches' (it was the last batch's alone), and the trajectories are counted over all four."""
    from types import SimpleNamespace

    from rl_train import tasks
    from rl_train.flows.step import run_global_step

    rewards = iter([0.25, 0.5, 0.75, 1.0])

    def phase(name: str, fn: Any) -> SimpleNamespace:
        return SimpleNamespace(name=name, fn=fn, retries=0)

    for name in ("balance", "old_log_prob", "advantage"):
        monkeypatch.setattr(tasks, name, phase(name, lambda *_: {}))
    monkeypatch.setattr(tasks, "generate", phase("generate", lambda *_: "batch"))
    monkeypatch.setattr(tasks, "reward", phase("reward", lambda *_: {"reward/mean": next(rewards)}))
    monkeypatch.setattr(tasks, "update", phase("update", lambda *_: {"agent/trajectories": 64.0}))
    config = SimpleNamespace(
        trainer=SimpleNamespace(train_batch_size=32, parameter_sync_step=4),
        actor=SimpleNamespace(kl_loss=False),
        algorithm=SimpleNamespace(kl_in_reward=False, adv_estimator="grpo"),
        critic=SimpleNamespace(enable=False),
        teacher=SimpleNamespace(on=False),
    )
    pools = SimpleNamespace(queue=SimpleNamespace(batch=lambda *_: {"groups": ["g"] * 8}))
    context = SimpleNamespace(replay_buffer=SimpleNamespace(release=lambda _: None), pools=pools, trained=[])
    trainer = SimpleNamespace(
        context=context,
        config=config,
        run_id="run",
        on_sample_begin=lambda *_: None,
        on_sample_end=lambda *_: None,
        on_step_end=lambda *_: {"replay/staleness_max": 1.0},
    )
    metrics = run_global_step(trainer, 1, direct=True)  # type: ignore[arg-type]
    assert metrics["reward/mean"] == pytest.approx(0.625)
    assert metrics["agent/trajectories"] == 256.0
    assert metrics["replay/staleness_max"] == 1.0 and metrics["timing/update"] >= 0.0
    assert len(context.trained) == 32
