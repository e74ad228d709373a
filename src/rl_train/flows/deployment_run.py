"""What a deployment run adds to its config: a root for relative paths and a run name of its own.

A run started with ``prefect deployment run rl-train/<mode>`` is executed by the process of
``rl-train serve``, possibly long after and far from the shell that asked for it. So:

- relative paths in its config resolve against a *root*: ``RL_TRAIN_ROOT`` when serve starts,
  else the directory serve was started from. Serve records it as every deployment's ``root``
  parameter (a run may pass its own with ``-p root=...``), and every path is made absolute
  before anything reads it, so an error about a missing file names the path that was tried;
- a run that names no ``run.name`` gets ``<trainer.mode>-<flow run name>-<flow run id[:8]>``:
  two runs never share a run directory by accident, and a retry of the *same* flow run (same
  id, same name) finds its own directory again and resumes it.
"""

from __future__ import annotations

import os
from typing import Any

from rl_train.config import Config

ROOT_ENV = "RL_TRAIN_ROOT"
"""Environment variable naming the root of a deployment run's relative paths."""
PATH_FIELDS = (
    "run.output_dir",
    "model.path",
    "data.data_dir",
    "data.train_files",
    "data.val_files",
    "checkpoint.dir",
)
"""Config fields holding a path or a list of paths (a URI such as ``s3://`` is left as is)."""


def serve_root() -> str:
    """The root recorded by ``rl-train serve``: ``RL_TRAIN_ROOT`` or serve's working directory."""
    return os.path.abspath(os.environ.get(ROOT_ENV) or os.getcwd())


def under_root(path: str, root: str) -> str:
    """``path`` joined to ``root`` when it is relative; absolute paths and URIs are kept."""
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(root, os.path.expanduser(path)))


def resolve_paths(config: Config, root: str) -> Config:
    """A copy of ``config`` whose ``PATH_FIELDS`` are absolute (relative ones under ``root``)."""
    tree = config.model_dump(mode="json")
    for dotted in PATH_FIELDS:
        *parents, name = dotted.split(".")
        section: dict[str, Any] | None = tree
        for part in parents:
            section = section.get(part) if section is not None else None
        if section is None or section.get(name) is None:
            continue  # an unset optional path, or a section this config does not have
        value = section[name]
        section[name] = [under_root(p, root) for p in value] if isinstance(value, list) else under_root(value, root)
    return Config.model_validate(tree)


def names_its_run(config: Config) -> bool:
    """Whether the config file or the overrides set ``run.name`` (rather than the default)."""
    return "name" in config.run.model_fields_set


def deployment_run_name(mode: str, flow_run_name: str, flow_run_id: str) -> str:
    """The run name of a deployment run that names none: stable across retries of one flow
    run, distinct between flow runs (the id's first 8 hex digits tell apart equal names)."""
    return f"{mode}-{flow_run_name}-{flow_run_id.replace('-', '')[:8]}"


def deployment_config(config: Config, root: str, flow_run_name: str, flow_run_id: str) -> Config:
    """``config`` as a deployment run uses it: its own run name when it names none, then every
    path absolute under ``root``."""
    if not names_its_run(config):
        config = config.model_copy(deep=True)
        config.run.name = deployment_run_name(config.trainer.mode, flow_run_name, flow_run_id)
    return resolve_paths(config, root)
