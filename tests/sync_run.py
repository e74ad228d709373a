"""A short sync run for integration tests: ``fit_sync_run(small_run_config, steps, actor={...})``."""

from __future__ import annotations

from typing import Any


def fit_sync_run(small_run_config: dict[str, Any], total_steps: int, **sections: dict[str, Any]) -> Any:
    """Fit a sync run of ``small_run_config`` without Prefect or validation, ``total_steps``
    long, each of ``sections`` merged into its config section; returns the trainer."""
    import copy

    from rl_train.config import Config, apply_mode_defaults
    from rl_train.flows.registry import get_trainer_class

    data = copy.deepcopy(small_run_config)
    data["trainer"].update(mode="sync", use_prefect=False, val_every_steps=0, total_steps=total_steps)
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    apply_mode_defaults(data)
    trainer = get_trainer_class("sync")(Config.model_validate(data))
    trainer.fit()
    return trainer
