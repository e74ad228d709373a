"""The sync replay buffer (R-2.9): dispatch prompts, then sample complete groups.

Prompts enter the TransferQueue as ``pending`` records, one group per prompt; rollout
replicas mark them ``running`` and ``finished`` and write ``n`` trajectories each. A group is
sampleable once its prompt is finished and all its trajectories are present; samples are
taken oldest first. The async buffers of the async modes share this interface.

DAPO group filter (R-7.3, opt-in with ``replay.filter_groups``): after each generation
round the groups without gradient are evicted, and each evicted group is refilled with two
fresh prompts (a second round would otherwise often come up short again). Once enough groups
with gradient are ready, dispatch stops (draining) and ``sample`` discards the surplus. After
``replay.max_filter_rounds`` rounds, groups without gradient fill what is still missing (they
contribute zero advantage) and are counted as ``replay/filter_shortfall``, so a policy that
solves everything slows down instead of stalling.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from rl_train.storage.group_scoring import groups_with_gradient, trajectory_keys
from rl_train.storage.handles import call, submit, wait_all
from rl_train.storage.replay_base import ReplayBufferBase

PARTITION = "train"


class ReplayBuffer(ReplayBufferBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counts: Counter[str] = Counter()

    def dispatch(self, num_groups: int, step: int) -> list[str]:
        """Generate ``num_groups`` new prompt groups (blocking); with the DAPO filter, keep
        generating until that many carry gradient. Returns every group left in the queue."""
        keys = self._generate(num_groups, step)
        if not self.cfg.filter_groups:
            return keys
        ready: list[str] = []
        for round_number in range(1, self.cfg.max_filter_rounds + 1):
            verdict = groups_with_gradient(self.tq, self.rewards, PARTITION, keys, self.n)
            ready += [k for k in keys if verdict[k]]
            no_gradient = [k for k in keys if not verdict[k]]
            if len(ready) < num_groups and round_number == self.cfg.max_filter_rounds:
                filler = no_gradient[: num_groups - len(ready)]
                ready += filler
                no_gradient = no_gradient[len(filler) :]
                self._counts["filter_shortfall"] += len(filler)
            self._delete(no_gradient)
            self._counts["evicted_filter"] += len(no_gradient)
            if len(ready) >= num_groups:
                break  # draining: no more dispatch; sample discards the surplus
            keys = self._generate(2 * len(no_gradient), step)
            self._counts["refill"] += len(keys)
        return ready

    def _generate(self, num_groups: int, step: int) -> list[str]:
        taken = self.loader.take(num_groups)
        records = {f"p{index}": dict(row, prompt_step=step) for index, row in taken}
        tags = {key: {"kind": "prompt", "status": "pending", "step": step} for key in records}
        call(self.tq, "put", PARTITION, records, tags)
        keys = list(records)
        shards = [keys[i :: len(self.rollouts)] for i in range(len(self.rollouts))]
        # every replica generates at once, then each is awaited
        wait_all(
            [
                submit(r, "generate_prompts", PARTITION, s, self.n, self.sampling)
                for r, s in zip(self.rollouts, shards, strict=True)
                if s
            ]
        )
        return keys

    def sample(self, num_groups: int, step: int) -> str:
        """A batch of ``num_groups`` complete groups (oldest first); returns its batch id.

        With the DAPO filter on, finished groups beyond ``num_groups`` (its over-provisioning)
        are discarded; without it they stay for the next sample.
        """
        finished = call(self.tq, "query", PARTITION, kind="prompt", status="finished")
        if len(finished) < num_groups:
            raise RuntimeError(f"replay buffer: {len(finished)} finished groups, {num_groups} requested")
        groups, surplus = finished[:num_groups], finished[num_groups:]
        if surplus and self.cfg.filter_groups:  # the filter's over-provisioning
            self._delete(surplus)
            self._counts["discarded_surplus"] += len(surplus)
        batch_id = f"step{step}-{uuid.uuid4().hex[:8]}"
        call(
            self.tq,
            "put_batch",
            batch_id,
            PARTITION,
            trajectory_keys(groups, self.n),
            groups=groups,
            step=step,
        )
        return batch_id

    def _delete(self, groups: list[str]) -> None:
        if groups:
            call(self.tq, "delete", PARTITION, groups + trajectory_keys(groups, self.n))

    def release(self, batch_id: str) -> None:
        """Forget a trained batch: its trajectories and their prompts leave the queue."""
        batch = call(self.tq, "get_batch", batch_id)
        call(self.tq, "delete", PARTITION, batch["groups"])
        call(self.tq, "drop_batch", batch_id)

    def pop_metrics(self) -> dict[str, float]:
        """The DAPO filter's figures since the last call (zeros when it is off)."""
        names = ("evicted_filter", "refill", "discarded_surplus", "filter_shortfall")
        metrics = {f"replay/{name}": float(self._counts[name]) for name in names}
        self._counts.clear()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"loader_position": self.loader.position}
