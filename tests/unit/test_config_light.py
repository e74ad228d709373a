"""Config validation without torch: the built-in names it knows by heart are the registries'."""

from __future__ import annotations

from import_probe import imported_after

from rl_train.algorithms.config import (
    BUILTIN_CRITIC_ESTIMATORS,
    BUILTIN_GREEDY_BASELINE_ESTIMATORS,
    BUILTIN_NAMES,
    NO_NORM_LENGTH_MODES,
)
from rl_train.engines.weight_sync.config import BUILTIN_BACKENDS


def test_the_builtin_name_tables_are_the_registries() -> None:
    import importlib

    for (module, registry), names in BUILTIN_NAMES.items():
        assert names == frozenset(getattr(importlib.import_module(module), registry).names()), registry


def test_the_estimators_that_read_a_critic_are_the_registrys() -> None:
    from rl_train.algorithms.advantage import ADV_ESTIMATORS, estimator_needs

    assert {name for name in ADV_ESTIMATORS.names() if estimator_needs(name).critic} == BUILTIN_CRITIC_ESTIMATORS


def test_the_estimators_that_read_a_greedy_baseline_are_the_registrys() -> None:
    from rl_train.algorithms.advantage import ADV_ESTIMATORS, estimator_needs

    needs = {name for name in ADV_ESTIMATORS.names() if estimator_needs(name).greedy_baseline}
    assert needs == BUILTIN_GREEDY_BASELINE_ESTIMATORS


def test_the_modes_without_a_norm_length_are_the_aggregators() -> None:
    from rl_train.algorithms.aggregation import AGGREGATORS, norm_length_error

    assert {mode for mode in AGGREGATORS.names() if norm_length_error(mode, None) is None} == NO_NORM_LENGTH_MODES


def test_the_builtin_weight_sync_backends_are_the_registrys() -> None:
    from rl_train.engines.weight_sync.base import WEIGHT_SYNC_BACKENDS, import_builtin_backends

    import_builtin_backends()
    assert {name: WEIGHT_SYNC_BACKENDS.get(name).uses_transport for name in WEIGHT_SYNC_BACKENDS.names()} == BUILTIN_BACKENDS


def test_loading_the_demo_config_imports_no_torch() -> None:
    statement = "from rl_train.config import load_config; load_config('configs/arith-tiny.yaml', [])"
    assert imported_after(statement, ("torch", "prefect", "ray", "transformers")) == []
