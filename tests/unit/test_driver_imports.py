"""The driver imports no torch: tasks carry keys, so only the actors need it (start-up CPU)."""

from __future__ import annotations

import pytest
from import_probe import imported_after

DRIVER_MODULES = (
    "import importlib; from rl_train.flows.startup import HEAVY_MODULES; "
    "[importlib.import_module(m) for m in HEAVY_MODULES]"
)


def test_the_flows_pools_and_worker_classes_import_no_torch() -> None:
    assert imported_after(DRIVER_MODULES, ("torch", "transformers")) == []


@pytest.mark.parametrize("backend", ["naive", "bucketed", "delta"])
def test_building_a_weight_sync_backend_in_the_driver_imports_no_torch(backend: str) -> None:
    statement = (
        "from rl_train.engines.weight_sync.backends import build_weight_sync_backend; "
        "from rl_train.engines.weight_sync.config import WeightSyncConfig; "
        f"build_weight_sync_backend(WeightSyncConfig(backend={backend!r}))"
    )
    assert imported_after(statement, ("torch",)) == []


def test_a_worker_binds_what_its_methods_use_when_it_is_built() -> None:
    """The engine-side names exist once ``_import_engine_side`` ran (as ``__init__`` does)."""
    from rl_train.engines.workers import critic_worker, rollout_worker, trainer_worker

    for module, names in (
        (trainer_worker, ("torch", "collate", "build_training_engine", "run_sender", "join_world")),
        (critic_worker, ("torch", "collate", "TorchValueEngine", "explained_variance")),
        (rollout_worker, ("torch", "run_receiver", "rng_state", "set_rng_state")),
    ):
        module._import_engine_side()
        assert all(callable(getattr(module, name, None)) or name == "torch" for name in names), module.__name__
        assert hasattr(module.torch, "Tensor")
