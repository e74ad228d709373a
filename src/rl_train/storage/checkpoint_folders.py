"""The step folders under a checkpoint root: their names and the paths of parts in them, what
one listing shows of them, and which of them retention removes.

A commit needs to know three things about the root: whether its own step is committed already,
whether every part it names is there with its size, and which older folders to prune. One
recursive listing answers all three (on S3 one request per thousand objects, where a listing
per step folder, or a listing bounded in depth, costs a request per folder), so a commit lists
the root once and hands the result to prune instead of listing again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import fsspec

from rl_train.storage.checkpoint_manifest import MANIFEST_NAME

_STEP_DIR = re.compile(r"step-(\d{8,})")


def step_dir_name(step: int) -> str:
    """``step-00000012``: zero-padded so that folder names sort as steps do."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step is an int >= 0, not {step!r}")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step of a folder named by ``step_dir_name``; None for any other name."""
    match = _STEP_DIR.fullmatch(name)
    if match is None or step_dir_name(int(match[1])) != name:
        return None
    return int(match[1])


@dataclass
class StepFolder:
    """One step folder as a listing saw it."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Relative path -> the filesystem's info (``size``; ``ETag`` on S3, ``mtime``/``ino`` on disk)."""

    @property
    def committed(self) -> bool:
        """Holds a manifest (its checksums unchecked: see ``CheckpointStore.verify``)."""
        return MANIFEST_NAME in self.files


def list_step_folders(fs: fsspec.AbstractFileSystem, root: str) -> dict[int, StepFolder]:
    """Every step folder under ``root`` with its files, from one recursive listing that bypasses
    the filesystem's cache (another process may have written since). A folder with no file in
    it (local disk only: S3 has no empty folders) is listed too: it is a torn write."""
    try:
        found = fs.find(root, withdirs=True, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    folders: dict[int, StepFolder] = {}
    for path, info in found.items():
        parts = path[len(root) + 1 :].split("/")
        step = parse_step_dir(parts[0])
        if step is None:
            continue
        folder = folders.setdefault(step, StepFolder())
        if len(parts) > 1 and info.get("type") != "directory":
            folder.files["/".join(parts[1:])] = info
    return folders


def list_step_folder(fs: fsspec.AbstractFileSystem, folder: str) -> StepFolder:
    """One step folder (its path) as a listing of it alone shows it, bypassing the cache."""
    try:
        found = fs.find(folder, detail=True, refresh=True)
    except FileNotFoundError:
        return StepFolder()
    return StepFolder({path[len(folder) + 1 :]: info for path, info in found.items()})


def select_pruned_steps(complete: list[int], torn: list[int], keep_last: int, keep_every: int) -> list[int]:
    """The steps ``prune`` deletes: committed ones neither among the newest ``keep_last`` nor a
    multiple of ``keep_every`` (0: none kept that way), and torn ones older than the newest
    committed step."""
    newest = sorted(complete)[-keep_last:]
    kept = set(newest) | {s for s in complete if keep_every and s % keep_every == 0}
    doomed = [s for s in complete if s not in kept]
    if complete:
        doomed += [s for s in torn if s < max(complete)]
    return sorted(doomed)
