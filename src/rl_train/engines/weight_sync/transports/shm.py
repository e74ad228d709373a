"""``shm``: the two bucket buffers live in POSIX shared memory that every receiver maps.

The sender packs straight into shared memory, so moving a bucket costs nothing but the
announcement; each receiver copies its tensors out and acks, which frees the buffer.
One host only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import torch

from rl_train.engines.weight_sync.errors import TransportError
from rl_train.engines.weight_sync.wire import Channel, Deadline


def available() -> str:
    return ""


def _map(segment: shared_memory.SharedMemory, size: int) -> torch.Tensor:
    return torch.frombuffer(segment.buf, dtype=torch.uint8, count=size)


def _release(segments: list[shared_memory.SharedMemory], views: list[torch.Tensor], unlink: bool) -> None:
    views.clear()  # the tensors export the mapping; they must go before close()
    for segment in segments:
        # BufferError: a caller still holds a view; the mapping then goes with the process.
        with contextlib.suppress(BufferError):
            segment.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                segment.unlink()
    segments.clear()


SEGMENT_PREFIX = "rlw_"
SHM_DIR = Path("/dev/shm")


def sweep_orphaned_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the segments of senders whose process is gone. A sender killed outright (a
    run stopped with SIGKILL, a lost machine) never reaches ``close()``; its segments carry
    its pid in their name (``rlw_<pid>_<id>_<i>``), so the next sender on the host removes
    them. A pid that is alive again (reused) keeps its segments: never unlink a live one."""
    removed = []
    for path in shm_dir.glob(f"{SEGMENT_PREFIX}*_*_*") if shm_dir.is_dir() else []:
        pid = path.name[len(SEGMENT_PREFIX) :].split("_", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Sender:
    data_before_meta = True

    def __init__(self, bucket_size_bytes: int, host: str, options: dict[str, Any]) -> None:
        sweep_orphaned_segments()
        prefix = f"{SEGMENT_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
        self._segments = [
            shared_memory.SharedMemory(name=f"{prefix}_{i}", create=True, size=bucket_size_bytes)
            for i in range(2)
        ]
        self._size = bucket_size_bytes
        self.buffers = [_map(segment, bucket_size_bytes) for segment in self._segments]

    def descriptor(self) -> dict[str, Any]:
        return {"names": [segment.name for segment in self._segments], "size": self._size}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{} for _ in hellos]

    def attach(self, conns: list[Channel], deadline: Deadline, key: bytes) -> None:
        return None

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        return None  # already in place

    def close(self) -> None:
        _release(self._segments, self.buffers, unlink=True)


class Receiver:
    """Maps the sender's segments without registering them with a resource tracker.

    ``SharedMemory(name)`` would register an attached segment for cleanup, and a process
    spawned by the sender shares its tracker, so the two would unlink or unregister the same
    name twice. Only the creator owns the segment; receivers map and unmap.

    Any process of the sender's user can write the segments (mode 0600), so they are
    ``shared_buffers``: the stream checks a private copy of each bucket against its tag.
    """

    shared_buffers = True

    def __init__(self, descriptor: dict[str, Any]) -> None:
        import _posixshmem

        self._maps: list[mmap.mmap] = []
        size = descriptor["size"]
        for name in descriptor["names"]:
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            except FileNotFoundError as exc:
                raise TransportError(
                    f"shared memory {name!r} of the sender is gone; is the sender alive?"
                ) from exc
            try:
                self._maps.append(mmap.mmap(fd, size))
            finally:
                os.close(fd)
        self._views = [torch.frombuffer(mapping, dtype=torch.uint8, count=size) for mapping in self._maps]

    def hello(self) -> dict[str, Any]:
        return {}

    def attach(self, welcome: dict[str, Any], channel: Channel, deadline: Deadline, key: bytes) -> None:
        return None

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        return self._views[index][:nbytes]

    def close(self) -> None:
        self._views.clear()
        for mapping in self._maps:
            with contextlib.suppress(BufferError):
                mapping.close()
        self._maps.clear()
