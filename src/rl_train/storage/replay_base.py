"""What every replay buffer is built from (R-2.9): the run's queue, replicas, prompts and knobs.

The trainer constructs the mode's buffer, or a custom ``replay.sampler`` class, with these
arguments; subclassing ``ReplayBufferBase`` is the easy way to write a custom one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_train.storage.dataset import PromptLoader
from rl_train.storage.replay_config import ReplayConfig


class ReplayBufferBase:
    def __init__(
        self,
        tq: Any,
        rollouts: list[Any],
        loader: PromptLoader,
        n: int,
        sampling: dict[str, Any],
        config: ReplayConfig | None = None,
        rewards: list[Any] | None = None,
    ) -> None:
        """``rewards`` (the reward pool) scores groups for the DAPO filter."""
        self.tq, self.rollouts, self.loader, self.n, self.sampling = tq, rollouts, loader, n, sampling
        self.cfg = config or ReplayConfig()
        self.rewards = rewards or []
        self.revive: Callable[[], list[int]] | None = None
        """Set by the trainer: brings back rollout replicas that died (restarted by Ray, reloaded
        with the current weights); returns the indices of those that had restarted."""

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
