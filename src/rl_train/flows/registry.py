"""The trainer class of each mode (R-2.1), resolved from ``rl_train.modes.MODES``.

The modes' table names each ``BaseTrainer`` subclass by import path beside the mode's config
defaults and refusals, so a config loads without importing the flows; a run imports its
mode's class here. Nothing registers itself when a flow module is imported.
"""

from __future__ import annotations

from rl_train.modes import MODES


def get_trainer_class(name: str) -> type:
    """The trainer class of mode ``name``; an unknown name lists the modes."""
    return MODES.get(name)


def trainer_modules() -> tuple[str, ...]:
    """The modules that define the modes' trainer classes (start-up imports them early)."""
    return tuple(MODES[name].module for name in MODES)
