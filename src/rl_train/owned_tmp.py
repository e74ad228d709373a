"""Temporary folders named after the process that owns them, swept once their owner is gone.

A folder made with ``tempfile.mkdtemp`` and removed in a ``finally`` is left behind when its
process is SIGKILLed (the OOM killer, a lost worker, a test that kills a trainer on purpose).
``owned_dir`` puts the owner's pid in the name (``<prefix><pid>-<random>``) and ``sweep``
removes the folders of that prefix whose owner no longer runs, so the next process that makes
one cleans up after a killed predecessor. A folder whose pid runs (its owner, or a process that
reused the pid) is kept: a sweep never removes a live process's folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep(prefix: str, root: str | Path | None = None) -> list[Path]:
    """Remove the ``prefix<pid>-*`` folders under ``root`` (the temp dir) whose pid is not running;
    returns those removed."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        pid_text, dash, _ = path.name[len(prefix) :].partition("-")
        if not dash or not pid_text.isdigit() or not path.is_dir() or path.is_symlink() or _alive(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def owned_dir(prefix: str, root: str | Path | None = None) -> Path:
    """A new private folder ``<prefix><this pid>-<random>``, after sweeping the orphans of ``prefix``."""
    sweep(prefix, root)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
