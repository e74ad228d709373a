"""Weight sync: moving trained weights from the training engine to rollout engines (R-8).

Backends are chosen by ``rollout.weight_sync.backend`` from ``WEIGHT_SYNC_BACKENDS`` (``backends``).
The names below are imported when first used, so that the config (which only needs
``WeightSyncConfig``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "WEIGHT_SYNC_BACKENDS": "backends",
    "NamedTensors": "base",
    "WeightReceiver": "base",
    "WeightSender": "base",
    "WeightSyncBackend": "base",
    "build_weight_sync_backend": "backends",
    "WeightSyncConfig": "config",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
