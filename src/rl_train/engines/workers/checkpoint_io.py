"""What a worker puts into a checkpoint beside its engine state: RNG states and the policy as an
HF model directory (R-9.2, R-9.5). Each worker writes its own parts straight to the store and
returns their manifest entries; only those entries cross to the driver, never tensors.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_train.storage.checkpoint import CheckpointStore, PartEntry


def rng_state() -> dict[str, Any]:
    """This process's torch, numpy and python RNG states, as plain data plus one tensor."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )


def clone_state(obj: Any) -> Any:
    """A deep copy with every tensor cloned to host memory: what a background write may hold
    while the worker's next update changes the live tensors."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: clone_state(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(clone_state(v) for v in obj)
    return obj


@dataclass
class CheckpointSnapshot:
    """A training rank's state copied to host memory between updates, written later."""

    state: Any
    """The engine's ``state_dict()``, tensors cloned."""
    rng: dict[str, Any]
    nonfinite_in_row: int = 0
    policy_dir: Path | None = None
    """A local HF directory of the policy (rank 0, when the checkpoint carries one)."""

    def write(self, store: CheckpointStore, step: int, prefix: str) -> list[PartEntry]:
        writes: list[Callable[[], PartEntry | list[PartEntry]]] = [
            partial(store.write_state, step, f"{prefix}/engine", self.state),
            partial(store.write_state, step, f"{prefix}/rng", self.rng),
            partial(store.write_json, step, f"{prefix}/worker.json", {"nonfinite_in_row": self.nonfinite_in_row}),
        ]
        if self.policy_dir is not None:
            writes += upload_writes(store, step, "policy", self.policy_dir)
        return store.write_concurrently(writes)


def upload_writes(store: CheckpointStore, step: int, prefix: str, local: Path) -> list[Callable[[], PartEntry]]:
    """The writes that put every file under the local directory ``local`` under ``prefix`` in
    checkpoint ``step`` (for ``CheckpointStore.write_concurrently``)."""
    return [
        partial(store.write_bytes, step, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
        for path in sorted(local.rglob("*"))
        if path.is_file()
    ]
