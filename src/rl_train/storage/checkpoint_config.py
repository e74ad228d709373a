"""``checkpoint.*``: when a run saves its state, where, how many it keeps, and resume (R-9.2, R-9.3)."""

from __future__ import annotations

from pydantic import Field

from rl_train.algorithms.config import StrictModel


class CheckpointConfig(StrictModel):
    every_steps: int = Field(10, ge=0)
    """Save a checkpoint after every N global steps and after the last one; 0 saves none (a stopped run then starts over)."""
    dir: str | None = None
    """Where checkpoints go: a path or s3:// URI (None: <run dir>/checkpoints)."""
    keep_last: int = Field(3, ge=1)
    """Complete checkpoints kept, newest first; older ones are deleted once a newer one is committed."""
    keep_every: int = Field(0, ge=0)
    """Also keep every checkpoint whose step is a multiple of this (0: none beyond keep_last)."""
    resume: bool = True
    """A run directory that already holds this run resumes from its newest complete checkpoint (off: it is refused, as a reused run.name is)."""
    background: bool = True
    """Write checkpoints in the background while the next steps train (one write at a time)."""

    def root(self, run_dir: str) -> str:
        return self.dir or f"{run_dir.rstrip('/')}/checkpoints"
