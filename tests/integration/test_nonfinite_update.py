"""The trainer worker's update counts optimizer steps skipped for a NaN grad norm and stops the
run after ``actor.max_nonfinite_steps_in_row`` of them (records in a real TransferQueue actor)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import ray

from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.nonfinite import NonFiniteStepsError
from rl_train.engines.workers.trainer_worker import TrainerWorker
from rl_train.storage.transfer_queue import TransferQueue

pytestmark = pytest.mark.integration


def _put_records(tq, worker: TrainerWorker, name: str, advantage: float) -> list[str]:
    tok = worker.engine.tokenizer
    records = {}
    for i in range(4):
        response = tok.encode(str(i + 1), add_special_tokens=False) + [tok.eos_token_id]
        records[f"{name}/{i}"] = {
            "prompt_ids": [tok.bos_token_id, *tok.encode(f"{i}+1=", add_special_tokens=False)],
            "response_ids": response,
            "old_log_probs": [-1.0] * len(response),
            "advantages": [advantage * (i - 1.5)] * len(response),  # NaN in every row when NaN
        }
    ray.get(tq.put.remote("train", records))
    return list(records)


def test_update_counts_nonfinite_steps_and_stops_after_the_limit_in_a_row(
    tiny_model_dir: Path, ray_local
) -> None:
    tq = ray.remote(TransferQueue).options(num_cpus=0).remote()
    actor = ActorConfig(num_threads=1, max_nonfinite_steps_in_row=3).model_dump()
    worker = TrainerWorker(0, 1, str(tiny_model_dir), actor, 10, 1.0, 0, tq)
    try:
        bad = _put_records(tq, worker, "bad", math.nan)
        good = _put_records(tq, worker, "good", 1.0)
        metrics = worker.update("train", bad, num_mini_batches=2)
        assert metrics["actor/nonfinite_steps"] == 2.0  # a count per update, not a mean
        assert metrics["actor/nonfinite_steps_in_row"] == 2.0
        metrics = worker.update("train", good, num_mini_batches=1)
        assert metrics["actor/nonfinite_steps"] == 0.0 and metrics["actor/nonfinite_steps_in_row"] == 0.0
        assert worker.update("train", bad, num_mini_batches=2)["actor/nonfinite_steps_in_row"] == 2.0
        with pytest.raises(NonFiniteStepsError, match=r"^3 optimizer steps in a row .* = 3\)"):
            worker.update("train", bad, num_mini_batches=1)
    finally:
        ray.kill(tq)
