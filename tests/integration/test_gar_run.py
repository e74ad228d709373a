"""GAR's invariants through the real pipeline (R-6.6): short runs with ``reward.gar`` on, in each
trainer mode. The reward workers grade each whole group (the built-in brevity grader, with a
hacking rule and a failing grader added by the test), the queue actor reshapes the advantages,
and the advantages the update trains on are read back from the queue's records and checked
against the estimator without GAR (GRPO) on the same records."""

from __future__ import annotations

import copy
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from rl_train.algorithms.gar import redistribute_group_advantages
from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.reward.base import GroupInfra, GroupVerdict, RewardResult, Trajectory
from rl_train.engines.reward.gar_graders import Brevity
from rl_train.engines.reward.metrics import ScoredSample
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.queue_worker import QueueWorker
from rl_train.engines.workers.reward_worker import RewardWorker
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

CAPTURED = ["group_id", "reward", "advantages"]
CAPTURED_OPTIONAL = ["is_infra", "response_mask", "gar_quality", "gar_hacking", "gar_infra"]


def _code(text: str) -> int:
    return sum(map(ord, text))


class CapturingQueue(QueueWorker):
    """Appends each batch's records, as the advantage phase leaves them for the update, to ``out``."""

    out = ""

    def compute_advantages(self, batch_id: str) -> dict[str, float]:
        metrics = super().compute_advantages(batch_id)
        batch = self.get_batch(batch_id)
        records = self.get(batch["partition"], batch["keys"], CAPTURED, CAPTURED_OPTIONAL)
        rows = [
            {k: (list(map(float, v)) if k in ("advantages", "response_mask") else v) for k, v in r.items()}
            for r in records
        ]
        with open(self.out, "a") as out:
            out.write(
                json.dumps(
                    {"metrics": {k: v for k, v in metrics.items() if k.startswith("gar/")}, "records": rows}
                )
                + "\n"
            )
        return metrics


def graded_by_the_test(
    trajectories: Sequence[Trajectory], results: Sequence[RewardResult]
) -> Sequence[GroupVerdict] | GroupInfra:
    """brevity's qualities; a passer whose text's code is a multiple of 3 is a hacker; a prompt
    whose code is a multiple of 5 has a grader that fails."""
    if _code(trajectories[0].prompt) % 5 == 0:
        return GroupInfra("the judge timed out")
    verdicts = Brevity(min_quality=0.1)(trajectories, results)
    return [
        GroupVerdict(v.quality, not r.is_infra and r.score >= 1.0 and _code(t.response) % 3 == 0)
        for v, t, r in zip(verdicts, trajectories, results, strict=True)
    ]


class GradedRewardWorker(RewardWorker):
    """A reward that half the tiny model's answers pass (by their text's code), some infra."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.grading is not None and isinstance(self.grading.grader, Brevity)  # reward.gar built it
        self.grading.grader = graded_by_the_test

    def score_trajectories(self, trajectories: list[Trajectory]) -> list[ScoredSample]:
        results = [
            RewardResult.infra("sandbox down")
            if _code(t.response) % 11 == 0
            else RewardResult(float(_code(t.response) % 2 == 0))
            for t in trajectories
        ]
        return [ScoredSample(t.data_source, r) for t, r in zip(trajectories, results, strict=True)]


def _grpo(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std(unbiased=True) + 1e-6)


def _trained(record: dict[str, Any]) -> float:
    """The one advantage of an outcome estimator, on the record's graded tokens."""
    values = {
        a
        for a, m in zip(
            record["advantages"],
            record.get("response_mask") or [1.0] * len(record["advantages"]),
            strict=True,
        )
        if m
    }
    assert len(values) <= 1, values
    return values.pop() if values else 0.0


def _check_group(rows: list[dict[str, Any]]) -> tuple[int, bool]:
    """GAR's invariants on one group's trained records; -> (hackers, reshaped by quality)."""
    infra = [r for r in rows if r.get("is_infra")]
    assert all(set(r["advantages"]) <= {0.0} for r in infra)  # no verdict, no gradient
    real = [r for r in rows if not r.get("is_infra")]
    trained = torch.tensor([_trained(r) for r in real])
    rewards = torch.tensor([float(r["reward"]) for r in real])
    if (
        not real or real[0].get("gar_quality") is None or real[0].get("gar_infra")
    ):  # no verdict: the estimator's own
        assert torch.allclose(trained, _grpo(rewards), atol=1e-5)
        return 0, False
    passed = rewards >= 1.0
    quality = torch.tensor([float(r["gar_quality"]) for r in real])
    hacked = torch.tensor([bool(r["gar_hacking"]) for r in real])
    assert torch.allclose(trained, redistribute_group_advantages(rewards, passed, quality, hacked), atol=1e-5)
    plain = _grpo(torch.where(hacked, torch.zeros_like(rewards), rewards))  # GRPO on the effective rewards
    receivers = passed & ~hacked & (plain > 0)
    assert float(trained[receivers].sum()) == pytest.approx(
        float(plain[receivers].sum()), abs=1e-4
    )  # mass kept
    assert torch.allclose(trained[~receivers], plain[~receivers], atol=1e-5)  # failers and hackers: GRPO's
    assert bool((trained[hacked] <= 1e-6).all())  # a hacker gains nothing
    if bool(receivers.any()) and bool((~passed | hacked).any()):
        assert float(trained[receivers].min()) > float(trained[~passed | hacked].max())  # passers stay above
    return int(hacked.sum()), bool(receivers.any()) and bool((quality[receivers] < 1).any())


@pytest.mark.parametrize(
    "mode", ["sync", pytest.param("colocate_async", marks=pytest.mark.slow), "separate_async"]
)
def test_gar_invariants_on_what_the_update_trains(
    small_run_config: dict[str, Any], ray_local, tmp_path: Path, mode: str
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    out = tmp_path / "batches.jsonl"
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode=mode, use_prefect=False, val_every_steps=0, total_steps=2)
    data["reward"] = {"gar": {"grader": "brevity"}, "max_infra_retries": 0}
    data["rollout"]["max_new_tokens"] = 6
    apply_mode_defaults(data)
    classes = WorkerClasses(
        queue=type("Queue", (CapturingQueue,), {"out": str(out)}), reward=GradedRewardWorker
    )
    base = get_trainer_class(mode)
    trainer = type(f"Gar{base.__name__}", (base,), {"worker_classes": classes})(Config.model_validate(data))
    assert len(trainer.fit()) == 2

    batches = [json.loads(line) for line in out.read_text().splitlines()]
    hackers = reshaped = failed = 0
    for batch in batches:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in batch["records"]:
            groups[record["group_id"]].append(record)
        assert all(len(rows) == 4 for rows in groups.values())
        for rows in groups.values():
            flagged, by_quality = _check_group(rows)
            hackers, reshaped = hackers + flagged, reshaped + by_quality
        failed += sum(any(r.get("gar_infra") for r in rows) for rows in groups.values())
        assert batch["metrics"]["gar/hacking_flagged"] == sum(
            bool(r.get("gar_hacking")) and not r.get("is_infra") for r in batch["records"]
        )
        assert batch["metrics"]["gar/infra_groups"] == sum(
            any(r.get("gar_infra") for r in rows) for rows in groups.values()
        )
    assert hackers > 0 and reshaped > 0 and failed > 0, (hackers, reshaped, failed)  # every path was taken
    metrics = read_metrics(trainer.run_dir)
    assert sum(m["gar/hacking_flagged"] for m in metrics) == hackers
    assert sum(m["gar/infra_groups"] for m in metrics) == failed
