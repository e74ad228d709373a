"""A sender killed outright never unlinks its shared memory; the next sender on the host removes
the segments of senders whose process is gone, and never those of a live one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rl_train.engines.weight_sync.transports.shm import SEGMENT_PREFIX, sweep_orphaned_segments


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_segments_of_a_dead_sender_are_swept_and_a_live_senders_are_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"{SEGMENT_PREFIX}{_dead_pid()}_0123456789ab_0"
    live = tmp_path / f"{SEGMENT_PREFIX}{os.getpid()}_0123456789ab_0"
    unrelated = tmp_path / "rlw_legacy_name"  # no pid in the name: not ours to judge
    for path in (dead, live, unrelated):
        path.write_bytes(b"\0" * 16)
    assert sweep_orphaned_segments(tmp_path) == [dead.name]
    assert not dead.exists() and live.exists() and unrelated.exists()


def test_a_sender_names_its_segments_with_its_pid() -> None:
    from rl_train.engines.weight_sync.transports.shm import Sender

    sender = Sender(1024, "127.0.0.1", {})
    try:
        names = sender.descriptor()["names"]
        assert all(name.startswith(f"{SEGMENT_PREFIX}{os.getpid()}_") for name in names)
        assert not set(sweep_orphaned_segments()) & set(names)  # a live sender's segments stay
        assert all(Path("/dev/shm", name).exists() for name in names)
    finally:
        sender.close()
    assert not any(Path("/dev/shm", name).exists() for name in names)
