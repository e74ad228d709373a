"""The sync replay buffer (R-2.9): dispatch prompts, then sample complete groups.

Prompts enter the TransferQueue as ``pending`` records, one group per prompt; rollout
replicas mark them ``running`` and ``finished`` and write ``n`` trajectories each. A group is
sampleable once its prompt is finished and all its trajectories are present; samples are
taken oldest first. The async buffers of the async modes share this interface.
"""

from __future__ import annotations

import uuid
from typing import Any

import ray

from rl_train.storage.dataset import PromptLoader


class ReplayBuffer:
    def __init__(
        self,
        tq: Any,
        rollouts: list[Any],
        loader: PromptLoader,
        n: int,
        sampling: dict[str, Any],
        config: Any = None,
        rewards: list[Any] | None = None,
    ) -> None:
        """``config`` (``replay.*``) and ``rewards`` are accepted for a common signature; sync needs neither."""
        self.tq = tq
        self.rollouts = rollouts
        self.loader = loader
        self.n = n
        self.sampling = sampling

    def dispatch(self, num_groups: int, step: int) -> list[str]:
        """Put ``num_groups`` new prompts as pending and have the replicas generate them (blocking)."""
        taken = self.loader.take(num_groups)
        records = {f"p{index}": dict(row, prompt_step=step) for index, row in taken}
        tags = {key: {"kind": "prompt", "status": "pending", "step": step} for key in records}
        ray.get(self.tq.put.remote("train", records, tags))
        keys = list(records)
        shards = [keys[i :: len(self.rollouts)] for i in range(len(self.rollouts))]
        ray.get(
            [
                replica.generate_prompts.remote("train", shard, self.n, self.sampling)
                for replica, shard in zip(self.rollouts, shards, strict=True)
                if shard
            ]
        )
        return keys

    def sample(self, num_groups: int, step: int) -> str:
        """A batch of ``num_groups`` complete groups (oldest first); returns its batch id."""
        finished = ray.get(self.tq.query.remote("train", kind="prompt", status="finished"))
        if len(finished) < num_groups:
            raise RuntimeError(f"replay buffer: {len(finished)} finished groups, {num_groups} requested")
        groups = finished[:num_groups]
        keys = [f"{group}/{j}" for group in groups for j in range(self.n)]
        batch_id = f"step{step}-{uuid.uuid4().hex[:8]}"
        ray.get(self.tq.put_batch.remote(batch_id, "train", keys, groups=groups, step=step))
        return batch_id

    def release(self, batch_id: str) -> None:
        """Forget a trained batch: its trajectories and their prompts leave the queue."""
        batch = ray.get(self.tq.get_batch.remote(batch_id))
        ray.get(self.tq.delete.remote("train", batch["groups"]))
        ray.get(self.tq.drop_batch.remote(batch_id))

    def state_dict(self) -> dict[str, Any]:
        return {"loader_position": self.loader.position}
