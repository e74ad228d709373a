"""How a run starts on its run directory: fresh, over a previous run, or resumed (R-9.3, R-9.5).

Re-running the command of a run that was killed is how a user resumes it: a run directory
that already holds this run (its ``config.yaml``, same settings) continues from its newest
complete checkpoint, or from step 0 when it was killed before its first one. Nothing is ever
silently replaced: a directory that holds a run with *different* settings is refused, naming
each setting that differs, unless the user asks to overwrite it (``run.overwrite``); with
``checkpoint.resume=false`` any earlier run is refused, as before resume existed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import fsspec
import yaml

from rl_train.config import Config
from rl_train.storage.checkpoint import CheckpointStore
from rl_train.storage.metrics import METRICS_FILE, MetricsWriter, RunDirectoryExistsError

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.yaml"
LEDGER_FILE = "trained_prompts.jsonl"
"""One line per global step: the prompt groups trained in it (the resume audit trail)."""
MAY_DIFFER = (
    "trainer.total_steps", "trainer.use_prefect", "trainer.step_layout", "run.overwrite", "checkpoint.", "ray.",
    "actor.infer_micro_batch_size",
)  # fmt: skip
"""Settings a resumed run may change: how long it runs, where, and how its forward-only passes
split a batch (the same log-probs up to float rounding), not what it trains."""


@dataclass(frozen=True)
class RunStart:
    kind: str
    """``fresh`` (nothing there), ``overwrite`` (a previous run the user replaces) or ``resume``."""
    checkpoint_step: int = 0
    """Resume: the newest complete checkpoint's step (0: none yet, the run starts over)."""


def checkpoint_store(config: Config, run_dir: str) -> CheckpointStore:
    cfg = config.checkpoint
    return CheckpointStore(cfg.root(run_dir), keep_last=cfg.keep_last, keep_every=cfg.keep_every)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def config_differences(saved: dict[str, Any], config: Config) -> list[str]:
    """``path: saved -> now`` for each setting that differs and may not (``MAY_DIFFER``)."""
    before, now = _flatten(saved), _flatten(config.model_dump(mode="json"))
    return [
        f"{path}: {before.get(path)!r} -> {now.get(path)!r}"
        for path in sorted(set(before) | set(now))
        if before.get(path) != now.get(path) and not path.startswith(MAY_DIFFER)
    ]


def plan_run_start(config: Config, run_dir: str) -> RunStart:
    """Decide, without changing anything, how the run starts on ``run_dir``; raises
    ``RunDirectoryExistsError`` when it must not start there."""
    fs, root = fsspec.core.url_to_fs(run_dir)
    root = root.rstrip("/")
    store = checkpoint_store(config, run_dir)
    previous = fs.exists(f"{root}/{METRICS_FILE}") or bool(store.complete_steps())
    if not previous:
        return RunStart("fresh")
    if config.run.overwrite:
        return RunStart("overwrite")
    if not config.checkpoint.resume:
        raise RunDirectoryExistsError(
            f"the run dir {run_dir} holds a previous run and checkpoint.resume is off; pick another "
            "run.name, set checkpoint.resume=true to continue it, or run.overwrite=true to replace it"
        )
    saved_path = f"{root}/{CONFIG_FILE}"
    if fs.exists(saved_path):
        with fs.open(saved_path) as handle:
            differences = config_differences(yaml.safe_load(handle.read()) or {}, config)
        if differences:
            raise RunDirectoryExistsError(
                f"the run dir {run_dir} holds a run with other settings, so this run cannot resume "
                "it:\n  " + "\n  ".join(differences) + "\npick another run.name, or set "
                "run.overwrite=true to replace the earlier run"
            )
    # Present and of the right size: the workers check the checksums as they load it, and the
    # trainer falls back to an older checkpoint when one does not match (BaseTrainer._restore_newest).
    return RunStart("resume", store.latest_valid(content=False) or 0)


@dataclass
class RunFiles:
    """The run directory's per-step files, opened for a fresh or a resumed run."""

    metrics: MetricsWriter
    ledger: MetricsWriter
    history: list[dict[str, Any]]
    """The metrics rows of the steps already done (a resumed run's, up to its checkpoint)."""


def open_run_files(config: Config, run_dir: str, start: RunStart, store: CheckpointStore) -> RunFiles:
    """Claim the run directory as ``start`` decided. Overwriting removes the earlier run's
    checkpoints too (a later resume must never load them); resuming replaces the files with
    their rows up to the checkpoint, so that the steps after it are written once, by their re-run."""
    if start.kind == "overwrite":
        fs, root = fsspec.core.url_to_fs(store.root)
        if fs.exists(root):
            fs.rm(root, recursive=True)
    if start.kind != "resume":
        metrics = MetricsWriter(run_dir, overwrite=config.run.overwrite)
        return RunFiles(metrics, MetricsWriter(run_dir, name=LEDGER_FILE, claim=False), [])
    k = start.checkpoint_step
    for path in store.set_aside_after(k):  # torn or damaged: the steps after k are redone
        logger.warning("set aside %s: newer than the checkpoint this run resumes from (step %d)", path, k)
    metrics_rows = store.read_bytes(k, f"run/{METRICS_FILE}") if k else b""
    ledger_rows = store.read_bytes(k, f"run/{LEDGER_FILE}") if k else b""
    history = [json.loads(line) for line in metrics_rows.decode().splitlines() if line.strip()]
    return RunFiles(
        MetricsWriter(run_dir, resume_from=metrics_rows),
        MetricsWriter(run_dir, resume_from=ledger_rows, name=LEDGER_FILE, claim=False),
        history,
    )
