"""Where the files of a checkpoint go when they are copied to a local folder, decided before
any of them is written.

A checkpoint comes from a store that others may write, so its manifest's keys are input: the
manifest's parser already refuses a key with ``..``, an absolute path, a backslash, NUL or an
empty part (``checkpoint_manifest.part_path_problem``). The copy checks again where each file
would land, against the destination with its symlinks resolved, so that a symlink found in the
destination (one planted there, or a destination that is itself a link) cannot carry a write
outside it either: every target is checked before the first file is opened, each folder is
checked again once created, and each file is opened without following a symlink in its place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from rl_train.storage.checkpoint_manifest import CheckpointError, part_path_problem

OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def plan_targets(
    label: str, dest: str | Path, prefix: str, relpaths: list[str]
) -> tuple[Path, dict[str, Path]]:
    """The destination (resolved) and each part's target under it, ``relpath`` minus ``prefix``;
    ``CheckpointError`` naming the checkpoint (``label``), the key and why, for the first key that
    would land outside. Writes nothing."""
    root = Path(dest).resolve()
    targets = {}
    for relpath in relpaths:
        rest = relpath[len(prefix) :]
        problem = part_path_problem(relpath) or part_path_problem(rest)
        target = root / rest
        if problem is None and not _inside(root, target.resolve()):
            problem = f"resolves to {target.resolve()}, outside {root}"
        if problem is not None:
            raise CheckpointError(
                f"{label}: the manifest key {relpath!r} cannot be copied to {root}: {problem}"
            )
        targets[relpath] = target
    return root, targets


def open_target(label: str, root: Path, relpath: str, target: Path) -> BinaryIO:
    """``target`` opened for writing, its folders created, once they are seen to be under
    ``root`` (a folder that is a symlink out of it is refused) and the file itself is no symlink."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not _inside(root, target.parent.resolve()):
        raise CheckpointError(
            f"{label}: the manifest key {relpath!r} cannot be copied to {root}: "
            f"its folder resolves to {target.parent.resolve()}, outside it"
        )
    try:
        fd = os.open(target, OPEN_FLAGS, 0o644)
    except OSError as error:  # ELOOP: a symlink where the file goes
        raise CheckpointError(
            f"{label}: the manifest key {relpath!r} cannot be copied to {target}: {error}"
        ) from None
    return os.fdopen(fd, "wb")


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents
