"""The sync ReplayBuffer over a real TransferQueue actor and a real rollout replica, through
their typed clients (``QueueClient``, ``RolloutClient``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from rl_train.engines.workers.queue_client import QueueClient
from rl_train.engines.workers.rollout_pool import RolloutClient
from rl_train.engines.workers.rollout_worker import RolloutWorker
from rl_train.storage.dataset import PromptLoader
from rl_train.storage.replay_buffer import ReplayBuffer
from rl_train.storage.transfer_queue import TransferQueue

pytestmark = pytest.mark.integration


def test_dispatch_and_sample_complete_groups(tiny_model_dir: Path, ray_local) -> None:
    tq = ray.remote(TransferQueue).options(num_cpus=0).remote()
    replica = (
        ray.remote(RolloutWorker).options(num_cpus=0, max_concurrency=2).remote(str(tiny_model_dir), tq, 0, 1)
    )
    prompts = [
        {"prompt": f"{i}+1=", "data_source": "arith/single_digit_sum", "ground_truth": str(i + 1)}
        for i in range(9)
    ]
    buffer = ReplayBuffer(
        QueueClient(tq), [RolloutClient(replica)], PromptLoader(prompts, seed=0), n=3, sampling={"max_new_tokens": 3}
    )
    try:
        dispatched = buffer.dispatch(4, step=1)
        assert ray.get(tq.query.remote("train", kind="prompt", status="finished")) == dispatched
        batch_id = buffer.sample(3, step=1)
        batch = ray.get(tq.get_batch.remote(batch_id))
        assert batch["groups"] == dispatched[:3]  # oldest first
        assert batch["keys"] == [f"{g}/{j}" for g in dispatched[:3] for j in range(3)]
        tags = ray.get(tq.get_tags.remote("train", batch["keys"]))
        assert all(t["kind"] == "trajectory" and t["version"] == 0 and t["response_len"] >= 1 for t in tags)
        assert {t["group_id"] for t in tags} == set(dispatched[:3])
        buffer.release(batch_id)
        # the fourth group is still there and sampleable; the released ones are gone
        assert ray.get(tq.query.remote("train", kind="prompt")) == dispatched[3:]
        with pytest.raises(RuntimeError, match="1 finished groups, 2 requested"):
            buffer.sample(2, step=2)
        assert buffer.state_dict() == {"loader_position": 4}
    finally:
        ray.kill(replica)
        ray.kill(tq)
