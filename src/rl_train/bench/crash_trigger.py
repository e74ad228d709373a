"""Where a crash test aims each kill: mid checkpoint write, mid weight sync, or at random.

A ``KillTrigger`` reads the run's stderr, line by line (progress lines and the
``crash_probe`` markers), and answers with a ``Cue``: kill after a delay, or kill once a
checkpoint folder is part-written. Timing alone cannot hit a write of a hundred milliseconds
on a busy machine (a timer thread may wake that late), so a checkpoint kill watches the step
folder itself and fires while it holds some parts and no manifest yet.
"""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rl_train.bench.crash_probe import MARKER_PREFIX
from rl_train.storage.checkpoint import step_dir_name

PROGRESS = re.compile(r"^step\s+(\d+)/(\d+) \|")
RESUME = re.compile(r"^resuming (\S+) from checkpoint (\S+): step (\d+) is next")
MARKER = re.compile(rf"^{re.escape(MARKER_PREFIX)}([a-z]+)-(begin|end) (\d+)$")
KINDS = ("checkpoint", "sync", "random")
"""Where a kill is aimed: mid checkpoint write, mid weight sync, or at a random moment."""
MAX_PARTS_BEFORE_KILL = 12
"""A checkpoint of the tiny run has some 20 files: a kill comes after 1 to this many."""


@dataclass
class Estimates:
    """Durations seen so far in a run's launches (medians), to place random kills."""

    startup: list[float] = field(default_factory=list)
    """Launch to the first progress line."""
    step: list[float] = field(default_factory=list)

    @staticmethod
    def _median(values: list[float], default: float) -> float:
        return statistics.median(values) if values else default

    def startup_seconds(self) -> float:
        return self._median(self.startup, 20.0)

    def step_seconds(self) -> float:
        return self._median(self.step, 0.5)

    def learn(self, lines: list[tuple[float, str]]) -> None:
        progress = [t for t, line in lines if PROGRESS.match(line)]
        if progress:
            self.startup.append(progress[0])
            self.step += [b - a for a, b in zip(progress, progress[1:], strict=False)]


@dataclass(frozen=True)
class Cue:
    """When to kill: ``delay_seconds`` from now, or, with ``folder``, as soon as that checkpoint
    folder holds ``min_parts`` files and no manifest (a manifest first: this write was missed)."""

    delay_seconds: float = 0.0
    folder: Path | None = None
    min_parts: int = 1


class KillTrigger:
    """When to kill one launch, aimed at ``kind``.

    ``checkpoint`` and ``sync`` arm only once this launch has committed a checkpoint of its
    own, so that each kill leaves the run at least one step further on and the test ends: then
    a kill lands after 1 to ``MAX_PARTS_BEFORE_KILL`` parts of the next checkpoint write (a
    missed write re-arms it for the one after), or as the next weight push begins. ``random``
    kills either at a uniform moment of the expected start-up (Ray, the workers, the restore)
    or a uniform time within four steps after the first progress line (a step, a write, a
    sync, whatever runs then), each half the time.
    """

    def __init__(self, kind: str, rng: random.Random, estimates: Estimates, checkpoint_root: Path) -> None:
        if kind not in KINDS:
            raise ValueError(f"kill kind {kind!r}: expected one of {KINDS}")
        self.kind = kind
        self.rng = rng
        self.estimates = estimates
        self.checkpoint_root = checkpoint_root
        self.armed = False
        self.during_startup = kind == "random" and rng.random() < 0.5

    def at_launch(self) -> Cue | None:
        if not self.during_startup:
            return None
        return Cue(self.rng.uniform(0.0, self.estimates.startup_seconds()))

    def on_line(self, line: str) -> Cue | None:
        """The kill this line calls for, or None (not yet)."""
        if self.kind == "random":
            if self.during_startup or self.armed or not PROGRESS.match(line):
                return None
            self.armed = True
            return Cue(self.rng.uniform(0.0, 4 * self.estimates.step_seconds()))
        match = MARKER.match(line)
        if match is None:
            return None
        what, edge, step = match[1], match[2], int(match[3])
        if what == "ckpt" and edge == "end":
            self.armed = True
        elif self.armed and self.kind == "checkpoint" and what == "ckpt" and edge == "begin":
            folder = self.checkpoint_root / step_dir_name(step)
            return Cue(folder=folder, min_parts=self.rng.randint(1, MAX_PARTS_BEFORE_KILL))
        elif self.armed and self.kind == "sync" and what == "sync" and edge == "begin":
            return Cue()
        return None
