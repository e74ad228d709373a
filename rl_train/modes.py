"""What each trainer mode asks of the config (R-2.1, R-2.3): its defaults and its refusals.

The trainer classes (``flows/``) differ by lifecycle hooks; what a mode means for the config
lives here, so that loading and validating a config imports neither Ray, Prefect nor the
flows. ``flows.registry`` refuses a trainer class whose mode has no spec here, and a test
checks that the two tables name the same modes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_train.config import Config

DefaultValue = Any
"""A plain value, or a callable that gets the raw config data and returns the default."""


@dataclass(frozen=True)
class ModeSpec:
    name: str
    defaults: dict[str, DefaultValue] = field(default_factory=dict)
    """Dotted config keys this mode defaults differently, applied at load where the user set none."""
    check: Callable[[Config], list[str]] = field(default=lambda config: [])
    """What this mode cannot run with, one dotted-path message each."""


ASYNC_DEFAULTS: dict[str, DefaultValue] = {
    # Stale samples need correcting: on the demo task, colocate_async without IS
    # stayed at 0.09 mean reward after 40 steps, with token-level TIS it reached 0.40
    # (sync: 0.35). The tiny policy moves several nats per version on some tokens.
    "algorithm.rollout_correction.preset": "token_is",
}


def _separate_async_errors(config: Config) -> list[str]:
    t, errors = config.trainer, []
    mini = config.actor.ppo_mini_batch_size or t.train_batch_size // t.parameter_sync_step
    if t.train_batch_size != t.parameter_sync_step * mini:
        errors.append(
            f"trainer.train_batch_size ({t.train_batch_size}) must equal trainer.parameter_sync_step "
            f"({t.parameter_sync_step}) x actor.ppo_mini_batch_size ({mini}) in separate_async: "
            f"each local update is one mini-batch (set actor.ppo_mini_batch_size to "
            f"{t.train_batch_size // t.parameter_sync_step} or null)"
        )
    if config.rollout.num_replicas < 1:
        errors.append("rollout.num_replicas: separate_async needs a standalone rollout pool (> 0)")
    if config.rollout.weight_sync.backend == "naive":
        errors.append(
            "rollout.weight_sync.backend: 'naive' hands weights over in one process; "
            "separate_async pushes across pools: use 'bucketed' or 'delta'"
        )
    return errors


MODES: dict[str, ModeSpec] = {
    spec.name: spec
    for spec in (
        ModeSpec("sync"),
        ModeSpec(
            "colocate_async",
            {
                **ASYNC_DEFAULTS,
                # at most 1 version behind (R-7.2 staleness 2). Partial rollouts meet it by
                # construction; a group held past its step by a slow tool call is evicted instead.
                "replay.max_off_policy_threshold": 2,
            },
        ),
        ModeSpec(
            "separate_async",
            {
                **ASYNC_DEFAULTS,
                "trainer.parameter_sync_step": 4,
                "rollout.weight_sync.backend": "bucketed",  # pushes cross pools
                # staleness <= parameter_sync_step versions behind, i.e. staleness
                # <= pss + 1, also for groups that a long tool call kept out past their step.
                "replay.max_off_policy_threshold": lambda data: int(data["trainer"]["parameter_sync_step"])
                + 1,
            },
            _separate_async_errors,
        ),
    )
}


def get_mode(name: str) -> ModeSpec:
    """The spec of a registered mode; an unknown name lists the registered ones."""
    try:
        return MODES[name]
    except KeyError:
        raise KeyError(f"unknown trainer mode {name!r}; available: {', '.join(sorted(MODES))}") from None
