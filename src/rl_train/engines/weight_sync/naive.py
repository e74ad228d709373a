"""``naive``: hand the whole state over in one piece.

The sender returns a name -> tensor dict as its payload. Between Ray actors the
orchestrator passes that payload through the object store; inside one process it is handed
over by reference, with no copy. Simple and correct, but peak memory is a full extra copy
of the weights and nothing overlaps: the bucketed and delta backends exist for that.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_train.engines.weight_sync.base import NamedTensors


class NaiveSender:
    def descriptor(self) -> dict[str, Any]:
        return {}

    def send(self, named_tensors: NamedTensors, version: int) -> dict[str, Any]:
        tensors = {name: tensor.detach() for name, tensor in named_tensors}
        return {"version": version, "tensors": tensors}

    def close(self) -> None:
        return None


class NaiveReceiver:
    def receive(self, payload: Any, timeout_seconds: float) -> tuple[NamedTensors, int]:
        if not isinstance(payload, dict) or "tensors" not in payload:
            raise ValueError("naive weight sync: receiver got no payload from the sender")
        tensors: dict[str, torch.Tensor] = payload["tensors"]
        return tensors.items(), int(payload["version"])

    def close(self) -> None:
        return None
