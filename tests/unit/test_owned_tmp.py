"""Temporary folders of killed processes are swept; a live process's folder never is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rl_train.owned_tmp import owned_dir, sweep


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_owners_folder_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"rlt-x-{_dead_pid()}-abc"
    dead.mkdir()
    (dead / "weights.bin").write_bytes(b"0" * 16)
    live = tmp_path / f"rlt-x-{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "rlt-x-notapid"
    other.mkdir()
    plain = tmp_path / f"rlt-x-{_dead_pid()}"  # a mkdtemp name of digits only: not an owned folder
    plain.mkdir()
    made = owned_dir("rlt-x-", tmp_path)
    assert not dead.exists() and live.is_dir() and other.is_dir() and plain.is_dir()
    assert made.is_dir() and made.name.startswith(f"rlt-x-{os.getpid()}-")
    assert sweep("rlt-x-", tmp_path) == []  # this process's folders stay


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "keep"
    target.mkdir()
    (target / "f").write_text("x")
    (tmp_path / f"rlt-y-{_dead_pid()}-l").symlink_to(target)
    assert sweep("rlt-y-", tmp_path) == []
    assert (target / "f").exists()
