"""``rollout.weight_sync.*``: which backend moves weights, and its knobs."""

from __future__ import annotations

from pydantic import Field

from rl_train.algorithms.config import StrictModel


class WeightSyncConfig(StrictModel):
    backend: str = "naive"
    """Registered weight-sync backend (rl_train.engines.weight_sync.WEIGHT_SYNC_BACKENDS)."""
    timeout_seconds: float = Field(120.0, gt=0)
    """Longest any blocking wait of a sync may take before it fails naming its boundary."""
