"""A rollout failure does not end the run (real Ray actors): a replica whose engine raises on
its second generate call, in sync mode (failed groups evicted and refilled) and in
colocate_async (background generation; failed groups retried). Every step completes and the
failures are counted in metrics.jsonl."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import ray

from rl_train.config import Config, apply_mode_defaults
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.workers.pools import WorkerClasses
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.flows.registry import get_trainer_class
from rl_train.storage.metrics import read_metrics

pytestmark = pytest.mark.integration

FAIL_ON_GENERATE_CALL = 2


class FlakyRolloutWorker(RolloutWorker):
    """A replica whose engine raises on its second ``generate`` call (a transient fault: an
    out-of-memory, a dropped connection); every other call generates normally."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generate_calls = 0
        engine_generate = self.engine.generate

        def generate(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
            self.generate_calls += 1
            if self.generate_calls == FAIL_ON_GENERATE_CALL:
                raise RuntimeError(f"injected rollout failure on generate call {self.generate_calls}")
            return engine_generate(requests, params)

        self.engine.generate = generate  # type: ignore[method-assign]


def _run(small_run_config: dict[str, Any], mode: str, **replay: Any) -> list[dict[str, Any]]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode=mode, use_prefect=False, val_every_steps=0)
    data["replay"] = replay
    apply_mode_defaults(data)
    base = get_trainer_class(mode)
    trainer_cls = type(
        f"Flaky{base.__name__}", (base,), {"worker_classes": WorkerClasses(rollout=FlakyRolloutWorker)}
    )
    trainer = trainer_cls(Config.model_validate(data))
    history = trainer.fit()
    assert len(history) == 3
    return read_metrics(trainer.run_dir)


def test_sync_run_evicts_and_refills_the_failed_groups_and_goes_on(
    small_run_config: dict[str, Any], ray_local
) -> None:
    metrics = _run(small_run_config, "sync", refill_failed_groups=True)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Step 2's one generate call (all 8 groups on the one replica) failed: 8 groups evicted,
    # 8 fresh prompts generated in their place, and the step trained on them.
    assert [m["rollout/generation_errors"] for m in metrics] == [0.0, 1.0, 0.0]
    assert [m["replay/evicted_failure"] for m in metrics] == [0.0, 8.0, 0.0]
    assert [m["replay/refill"] for m in metrics] == [0.0, 8.0, 0.0]
    assert all("actor/loss" in m for m in metrics)


def test_colocate_async_run_retries_the_failed_groups_and_goes_on(
    small_run_config: dict[str, Any], ray_local
) -> None:
    metrics = _run(small_run_config, "colocate_async")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert sum(m["rollout/generation_errors"] for m in metrics) == 1.0
    assert sum(m["replay/retried_failure"] for m in metrics) >= 1.0  # the failed batch's groups
    assert sum(m["replay/evicted_failure"] for m in metrics) == 0.0
    assert all("actor/loss" in m for m in metrics)
