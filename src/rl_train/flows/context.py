"""The driver's state of one run, owned by the trainer: one typed object, no grab-bag.

Everything in it but the replay buffer and the push in flight can be rebuilt from the run id
(the pools by name, the config from the queue actor); what the phases need of the run the
tasks rejoin by id (``tasks.context``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_train.config import Config
from rl_train.engines.workers.pools import PendingPush, WorkerPools
from rl_train.storage.replay_base import ReplayBufferBase


@dataclass
class RunContext:
    run_id: str
    config: Config
    pools: WorkerPools
    replay_buffer: ReplayBufferBase
    version: int = 0
    """Weight version (global step) that the rollout replicas serve, or are being pushed."""
    pending_push: PendingPush | None = None
    """separate_async: the push launched at the last step end, awaited at the next one."""
    trained: list[str] = field(default_factory=list)
    """The prompt groups trained since the last ``take_trained`` (the run's prompt ledger)."""

    def take_trained(self) -> list[str]:
        trained, self.trained = self.trained, []
        return trained
