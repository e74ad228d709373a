"""The trainer-mode registry (R-2.1): ``@register_trainer("sync")`` on a ``BaseTrainer`` subclass.

A mode's config defaults and refusals are its ``rl_train.modes`` spec, so the config loads
without importing the flows; a class can only be registered for a mode that has a spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from rl_train.modes import MODES
from rl_train.registry import Registry

TRAINERS: Registry[type] = Registry("trainer mode")


def register_trainer(name: str) -> Callable[[type], type]:
    if name not in MODES:
        raise ValueError(
            f"trainer mode {name!r} has no spec in rl_train.modes (its config defaults and checks); "
            f"modes with a spec: {', '.join(sorted(MODES))}"
        )
    return TRAINERS.register(name)


BUILTIN_TRAINER_MODULES = ("rl_train.flows.sync", "rl_train.flows.colocate_async", "rl_train.flows.separate_async")
"""The modules of the built-in modes, each of which registers its trainer when imported."""


def load_builtin_trainers() -> None:
    """Import the built-in modes so that they register."""
    for name in BUILTIN_TRAINER_MODULES:
        importlib.import_module(name)


def get_trainer_class(name: str) -> type:
    load_builtin_trainers()
    return TRAINERS.get(name)
