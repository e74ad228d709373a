"""The trainer class of each mode (R-2.1), resolved from ``rl_train.modes.MODES``.

The modes' table names each ``BaseTrainer`` subclass by import path beside the mode's config
defaults and refusals, so a config loads without importing the flows; a run imports its
mode's class here. Nothing registers itself when a flow module is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_train.modes import MODES

if TYPE_CHECKING:
    from rl_train.flows.base import BaseTrainer


def get_trainer_class(name: str) -> type[BaseTrainer]:
    """The trainer class of mode ``name``; an unknown name lists the modes."""
    trainer = MODES.get(name)
    from rl_train.flows.base import BaseTrainer

    if not (isinstance(trainer, type) and issubclass(trainer, BaseTrainer)):
        raise TypeError(f"trainer mode {name!r} names {trainer!r}, which is not a BaseTrainer subclass")
    return trainer


def trainer_modules() -> tuple[str, ...]:
    """The modules that define the modes' trainer classes (start-up imports them early)."""
    return tuple(MODES[name].module for name in MODES)
