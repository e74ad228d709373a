"""The top-level ``rl-train`` flow: build the configured trainer mode and fit it.

Its parameters are a config file path and dotted overrides (or an already-resolved config
dict), so a deployment run carries everything needed to reproduce it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run as this_flow_run

from rl_train import startup_clock
from rl_train.config import Config, load_config
from rl_train.flows.deployment_run import deployment_config, under_root
from rl_train.flows.registry import get_trainer_class


def build_trainer(config: Config, run_id: str | None = None) -> Any:
    """The trainer class registered under ``trainer.mode``."""
    return get_trainer_class(config.trainer.mode)(config, run_id=run_id)


def summarize(history: list[dict[str, Any]]) -> dict[str, Any]:
    last = history[-1] if history else {}
    val = [m["val/reward_mean"] for m in history if "val/reward_mean" in m]
    return {
        "steps": len(history),
        "final_reward_mean": last.get("reward/mean"),
        "final_val_reward_mean": val[-1] if val else None,
        "first_reward_mean": history[0].get("reward/mean") if history else None,
    }


def run_training(config: Config, run_id: str | None = None) -> dict[str, Any]:
    trainer = build_trainer(config, run_id)
    history = trainer.fit()
    return {"run_dir": trainer.run_dir, **summarize(history)}


# log_prints stays off: the trainer's stderr lines (the step lines, "resuming ... from checkpoint
# ...") belong on stderr, the terminal of `rl-train train` or serve's output for a served run.
# Prefect would turn them into INFO records of the run logger, which the WARNING level the
# project sets for Prefect (rl_train.runtime) drops: they would reach neither. The run page
# gets the step lines through a logger of its own (rl_train.flows.ui).
@flow(name="rl-train", validate_parameters=False, log_prints=False)
def train_flow(
    config: str | None = None,
    overrides: list[str] | None = None,
    resolved: dict[str, Any] | None = None,
    mode: str | None = None,
    root: str | None = None,
) -> dict[str, Any]:
    """Train with the config file ``config`` plus dotted ``overrides`` (or a ``resolved`` dict).

    ``mode`` (set by each deployment) pins ``trainer.mode`` after the overrides, so a run
    that passes its own ``overrides`` still runs the mode its deployment is named for.
    ``root`` (set by ``rl-train serve``) marks a deployment run: relative paths, the config
    file's included, resolve under it, and a run that names no ``run.name`` gets its own
    (``rl_train.flows.deployment_run``).
    """
    startup_clock.mark("flow")
    if root is None:
        return run_training(resolve_config(config, overrides, resolved, mode))
    cfg = resolve_config(under_root(config, root) if config else None, overrides, resolved, mode)
    return run_training(deployment_config(cfg, root, this_flow_run.name, this_flow_run.id))


def resolve_config(
    config: str | None, overrides: list[str] | None, resolved: dict[str, Any] | None, mode: str | None
) -> Config:
    """The run's config from the flow's parameters; ``mode`` wins over the overrides."""
    if resolved is not None:
        return Config.model_validate(resolved)
    return load_config(config, [*(overrides or []), *([f"trainer.mode={mode}"] if mode else [])])
