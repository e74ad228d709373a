"""Saving a run's checkpoints from the driver, and reading the driver's part back (R-9.2, R-2.2).

A checkpoint of step k is taken after step k, weight sync included, before step k+1 starts:
every batch has been trained and released, so the TransferQueue holds only prompts in flight
and finished groups waiting to be sampled. The workers copy their state to host memory (the
next step may start as soon as they have), then write their own parts straight to the store in
the background. The driver adds its part (data position, replay-buffer and version state, and
the run's ``metrics.jsonl`` and prompt ledger up to step k) and commits the manifest last,
from a single background writer: two writes of one run never overlap, and a run stopped
mid-write leaves a folder without a manifest, which no reader ever loads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rl_train.config import Config
from rl_train.engines.workers.pools import WorkerPools
from rl_train.storage.checkpoint import BackgroundWriter, CheckpointStore

logger = logging.getLogger(__name__)
DRIVER_STATE = "driver.json"


@dataclass
class DriverState:
    """The driver's share of a checkpoint: plain data."""

    step: int
    version: int
    buffer: dict[str, Any]
    num_ranks: int
    num_rollouts: int
    num_critic_ranks: int


@dataclass
class RunCheckpointer:
    config: Config
    store: CheckpointStore
    writer: BackgroundWriter | None = None
    saved: list[int] = field(default_factory=list)

    @classmethod
    def for_run(cls, config: Config, store: CheckpointStore) -> RunCheckpointer:
        return cls(config, store, BackgroundWriter() if config.checkpoint.background else None)

    def due(self, step: int) -> bool:
        every = self.config.checkpoint.every_steps
        return bool(every) and (step % every == 0 or step == self.config.trainer.total_steps)

    def save(self, step: int, pools: WorkerPools, driver: DriverState, run_files: dict[str, bytes]) -> float:
        """Start checkpoint ``step`` and return the seconds the step loop was held for it.

        ``run_files``: the run directory's files as of step k (metrics, ledger), kept with it."""
        started = time.perf_counter()
        if self.writer is not None:
            self.writer.wait()  # the previous write's error surfaces here, not never
        pending = pools.start_checkpoint(self.store.root, step, None, with_policy=True)
        meta = {"step": step, "mode": self.config.trainer.mode, "run": self.config.run.name}

        def finish() -> None:
            parts = pending.wait()
            parts += self.store.write_concurrently(
                [
                    partial(self.store.write_json, step, DRIVER_STATE, driver.__dict__),
                    *(partial(self.store.write_bytes, step, f"run/{name}", data) for name, data in run_files.items()),
                ]
            )
            self.store.commit(step, parts, meta)
            self.saved.append(step)
            logger.info("checkpoint %s committed (%d files)", self.store.step_uri(step), len(parts))

        if self.writer is None:
            finish()
        else:
            self.writer.submit(finish)
        return time.perf_counter() - started

    def close(self) -> None:
        """Wait for the last write (its error is raised here)."""
        if self.writer is not None:
            self.writer.close()


def read_driver_state(store: CheckpointStore, step: int) -> DriverState:
    return DriverState(**store.read_json(step, DRIVER_STATE))


def read_run_file(store: CheckpointStore, step: int, name: str) -> bytes:
    return store.read_bytes(step, f"run/{name}")
