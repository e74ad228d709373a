"""Weight sync: moving trained weights from the training engine to rollout engines (R-8).

Backends register in ``WEIGHT_SYNC_BACKENDS`` and are chosen by ``rollout.weight_sync.backend``.
"""

from rl_train.engines.weight_sync.base import (
    WEIGHT_SYNC_BACKENDS,
    NamedTensors,
    WeightReceiver,
    WeightSender,
    WeightSyncBackend,
    build_weight_sync_backend,
)
from rl_train.engines.weight_sync.config import WeightSyncConfig

__all__ = [
    "WEIGHT_SYNC_BACKENDS",
    "NamedTensors",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncBackend",
    "WeightSyncConfig",
    "build_weight_sync_backend",
]
