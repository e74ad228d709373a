"""What an evaluation reads of a run: its saved config, its checkpoints, the datasets to score
and how to sample (R-10.1).

A run is named by its directory (a path or ``s3://`` URI), as ``rl-train train --resume`` names
it; everything else comes from the ``config.yaml`` the run saved there. Relative paths in it
(and in the request) resolve under a root, as a deployment run's do
(``rl_train.flows.deployment_run``): the directory the command runs in, or serve's root.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import fsspec
import yaml

from rl_train.config import Config
from rl_train.engines.rollout.protocol import SamplingParams
from rl_train.flows.deployment_run import resolve_paths, under_root
from rl_train.flows.resume import CONFIG_FILE, checkpoint_store
from rl_train.storage.checkpoint import CheckpointError, CheckpointStore
from rl_train.storage.eval_results import EvalResults


class NoCheckpointError(CheckpointError):
    """The run has no complete checkpoint to evaluate (or not the step asked for)."""


@dataclass(frozen=True)
class EvalSettings:
    """How answers are sampled: by default as the run validates (``rollout.val_temperature``,
    greedy unless set, and ``rollout.max_new_tokens``), one answer per prompt."""

    temperature: float
    max_new_tokens: int
    n: int
    top_p: float = 1.0

    @classmethod
    def from_run(
        cls, config: Config, max_new_tokens: int | None, temperature: float | None, n: int
    ) -> EvalSettings:
        settings = cls(
            temperature=config.rollout.val_temperature if temperature is None else temperature,
            max_new_tokens=config.rollout.max_new_tokens if max_new_tokens is None else max_new_tokens,
            n=n,
        )
        if settings.n < 1 or settings.max_new_tokens < 1 or settings.temperature < 0:
            raise ValueError(
                f"an evaluation needs n >= 1, max_new_tokens >= 1 and temperature >= 0: {settings}"
            )
        return settings

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sampling(self, seed: int) -> SamplingParams:
        """Seeded, so that a sampled (temperature > 0) evaluation of a step is repeatable."""
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, seed=seed)


def load_run_config(run_dir: str, root: str) -> Config:
    """The config a run saved, its relative paths resolved under ``root``."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    saved = f"{path.rstrip('/')}/{CONFIG_FILE}"
    if not fs.exists(saved):
        raise FileNotFoundError(f"no run at {run_dir}: {run_dir.rstrip('/')}/{CONFIG_FILE} does not exist")
    return resolve_paths(Config.model_validate(yaml.safe_load(fs.cat_file(saved)) or {}), root)


def eval_datasets(config: Config, extra_files: list[str], root: str) -> dict[str, list[str]]:
    """Dataset name -> its files: ``val`` (the run's validation set, as the trainer resolves it)
    and each extra file under its stem (its full path when stems clash)."""
    datasets = {"val": config.data.resolved_val_files()}
    extra = [under_root(path, root) for path in extra_files]
    stems = [Path(path).stem for path in extra]
    for path, stem in zip(extra, stems, strict=True):
        datasets[stem if stems.count(stem) == 1 and stem != "val" else path] = [path]
    return datasets


@dataclass(frozen=True)
class EvalTarget:
    """A run under evaluation: where its checkpoints and results are, and what to score."""

    run_dir: str
    config: Config
    store: CheckpointStore
    results: EvalResults
    datasets: dict[str, list[str]]
    settings: EvalSettings

    @classmethod
    def open(
        cls,
        run_dir: str,
        root: str,
        extra_val_files: list[str] | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        n: int = 1,
    ) -> EvalTarget:
        run_dir = under_root(run_dir, root)
        config = load_run_config(run_dir, root)
        store = checkpoint_store(config, run_dir)
        return cls(
            run_dir=run_dir,
            config=config,
            store=store,
            results=EvalResults(store.root),
            datasets=eval_datasets(config, extra_val_files or [], root),
            settings=EvalSettings.from_run(config, max_new_tokens, temperature, n),
        )

    @property
    def run_name(self) -> str:
        return self.run_dir.rstrip("/").rsplit("/", 1)[-1]

    def next_step(self, step: int | None, failed: dict[int, str]) -> int:
        """``step`` if committed, else the newest committed step that has not ``failed`` (step ->
        why); listed afresh on every call, so a checkpoint the run committed meanwhile counts."""
        complete = self.store.complete_steps()
        left = [s for s in complete if s not in failed and step in (None, s)]
        if left:
            return left[-1]
        of_step = "" if step is None else f" of step {step}"
        why = "; ".join(failed.values()) or "a run saves one every checkpoint.every_steps steps"
        raise NoCheckpointError(
            f"the run {self.run_dir} has no complete checkpoint{of_step} under the checkpoint root "
            f"{self.store.root} (complete steps: {complete or 'none'}): {why}"
        )

    def pending(self, step: int, force: bool) -> list[str]:
        """The datasets not yet evaluated at ``step`` with these files and settings."""
        previous = (self.results.read_step(step) or {}).get("datasets", {})
        return [
            name
            for name, files in self.datasets.items()
            if force
            or previous.get(name, {}).get("files") != files
            or previous.get(name, {}).get("settings") != self.settings.as_dict()
        ]
