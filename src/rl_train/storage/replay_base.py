"""What every replay buffer is built from (R-2.9): the run's queue, replicas, prompts and knobs.

The trainer constructs the mode's buffer, or a custom ``replay.sampler`` class, with these
arguments; subclassing ``ReplayBufferBase`` is the easy way to write a custom one. The queue,
the replicas and the reward workers are typed handles (``storage/handles.py``): the run's
clients of its Ray actors, or plain objects in a unit test. ``Replica`` is what the buffer asks
of a replica: the sync buffer starts rounds (``GeneratingReplica``), the async one queues
prompts (``QueueingReplica``); the run's ``RolloutClient`` does both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.handles import QueueStore, RewardScorer
from rl_train.storage.replay_config import ReplayConfig

Replica = TypeVar("Replica")


class ReplayBufferBase(ABC, Generic[Replica]):
    def __init__(
        self,
        tq: QueueStore,
        rollouts: Sequence[Replica],
        loader: PromptLoader,
        n: int,
        sampling: dict[str, Any],
        config: ReplayConfig | None = None,
        rewards: Sequence[RewardScorer] | None = None,
    ) -> None:
        """``rewards`` (the reward pool) scores groups for the DAPO filter."""
        self.tq, self.rollouts, self.loader, self.n, self.sampling = tq, rollouts, loader, n, sampling
        self.cfg = config or ReplayConfig.model_validate({})
        self.rewards: Sequence[RewardScorer] = rewards or []
        self.revive: Callable[[], list[int]] | None = None
        """Set by the trainer: brings back rollout replicas that died (restarted by Ray, reloaded
        with the current weights); returns the indices of those that had restarted."""
        self.streaming = False
        """Set by the trainer from ``reward.streaming``: the reward workers score groups as they
        finish (``StreamingScorer``); a group is sampled only once its scores are in."""
        self.rescue: Callable[[list[str]], object] | None = None
        """Set by a mode with a spare engine: generates the given pending prompt groups now
        (R-2.7). A buffer that waits for groups (the async one) calls it when starved."""

    # -- what the step runs (R-2.9) --------------------------------------------------------
    @abstractmethod
    def dispatch(self, num_groups: int, step: int) -> list[str]:
        """Send ``num_groups`` new prompt groups to rollout; returns the keys of the groups it
        put in flight (the sync buffer: of those generated and ready)."""

    @abstractmethod
    def sample(self, num_groups: int, step: int) -> str:
        """A batch of ``num_groups`` complete groups, put in the queue; returns its batch id."""

    @abstractmethod
    def release(self, batch_id: str) -> None:
        """Forget a trained batch: its trajectories and their prompts leave the queue."""

    def prefetch(self, num_groups: int, step: int) -> None:
        """Start step ``step``'s first generation round now, without waiting; its ``dispatch``
        collects it. The sync trainer calls this right after a weight sync; a buffer that cannot
        start early (the default) does nothing, and ``dispatch`` generates as usual."""
        return None

    def pop_metrics(self) -> dict[str, float]:
        """Replay figures since the last call (R-7.6); a custom sampler may report none."""
        return {}

    # -- checkpoint (R-9.2, R-9.3) -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the buffer (plain data): at least the data position."""
        return {"loader_position": self.loader.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.position = int(state["loader_position"])

    def requeue(self, keys: list[str], step: int) -> None:
        """Resumed: ``keys`` are pending prompt groups restored into the queue (they were in
        flight at the checkpoint); generate them before any new prompt is drawn."""
        if keys:
            raise NotImplementedError(f"{type(self).__name__} cannot resume prompts in flight")
