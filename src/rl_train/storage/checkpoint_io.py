"""Bytes in and out of a checkpoint: one fsspec code path for local disk and ``s3://``.

- **The URI picks the filesystem** (``fsspec.core.url_to_fs``). The only difference kept is how
  a file becomes visible under its final name, and durable (``Publisher``): an object store
  shows an object only once its upload completes, and a completed PUT is atomic and durable, so
  it is written in place and there is nothing to sync; local disk shows a file while it is
  written, so it is written under a temporary name in the same folder and renamed with
  ``os.replace`` (a killed writer leaves a temporary file, never a half file under the name).
  A commit then makes the parts durable (``make_durable``: every part's data, then the folders
  holding their names), writes the manifest under a temporary name, fsyncs it, renames it into
  place and fsyncs the step folder: a power cut leaves either no manifest, or a manifest whose
  files and names reached the disk before it. (An object store needs none of it: an object
  appears whole when its PUT completes, and is durable by then.) Each part's writeback starts
  as it is written (``start_writeback``, not waited for), so that the disk writes one part while
  the next is serialized and the commit's fsyncs find little left to do: at the demo size this
  took the cost of durability from about 15% of the write's throughput to about 8%.
- **Checksums are taken from the bytes as they go by**, never by reading a file back. Large
  buffers are checksummed on a helper thread while the same chunk is written or the next one
  read: ``zlib.crc32`` (and ``hashlib``, for format-1 manifests) and file I/O all release the
  GIL, so the checksum costs little wall time.
- **On S3 a small checkpoint costs requests, not bytes**, so each operation here makes as few
  as it can: a whole small file is one GET (``read_whole``), and a folder is deleted with one
  bulk request per thousand files it is known to hold (``Publisher.delete_folders``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import os
import shutil
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, Protocol

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from rl_train.storage.checkpoint_manifest import CHECKSUM, CheckpointCorruptError, PartEntry

CHUNK_BYTES = 8 << 20
"""Unit of streaming and of overlapped hashing: large enough that per-chunk costs vanish,
small enough that a chunk in flight costs little memory."""
INLINE_HASH_BYTES = 1 << 20
"""Below this a chunk is checksummed on the calling thread: a hand-off costs more than that."""
S3_PROTOCOLS = ("s3", "s3a")
S3_EXTRA_HINT = "pip install 'rl-train[s3]'"


def open_filesystem(
    root: str, storage_options: dict[str, Any] | None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of ``root``. An ``s3://`` root needs s3fs (an optional extra);
    without explicit options it takes its endpoint from ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL``, as botocore would, but stated in the options so that fsspec's cache
    of filesystem instances never hands back one built for another endpoint."""
    protocol = fsspec.core.split_protocol(root)[0]
    if protocol in S3_PROTOCOLS:
        try:
            import s3fs  # noqa: F401
        except ImportError as error:
            raise ImportError(
                f"the checkpoint root {root} is on S3, which needs s3fs: {S3_EXTRA_HINT}"
            ) from error
        if storage_options is None:
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            storage_options = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    return fs, path.rstrip("/")


class Publisher(Protocol):
    """How a written file appears under its final name, all at once or not at all, and how
    files and folders go away."""

    concurrent_writes: int
    """How many files are best written at once: one on local disk (a write is CPU-bound, and
    checksums on a second core), several on an object store (a file is a request, and its
    latency dominates a small file)."""

    def open(self, path: str, durable: bool = False) -> contextlib.AbstractContextManager[BinaryIO]:
        """A handle to write ``path``; the file appears when the block exits without an error.
        ``durable``: its data reaches the disk before it appears, and its name right after."""
        ...

    def make_durable(self, files: list[str], folders: list[str]) -> None:
        """Make these files' data durable, then the names in these folders (a commit's parts)."""
        ...

    def delete_files(self, paths: list[str]) -> None:
        """Delete these files; a missing one is no error."""
        ...

    def delete_folders(self, folders: dict[str, list[str]]) -> None:
        """Delete each folder (its path -> the files a listing found in it) with what it holds."""
        ...


class LocalPublisher:
    """Write ``.<name>.<random>.tmp`` beside the target, then ``os.replace`` it into place."""

    concurrent_writes = 1

    @contextlib.contextmanager
    def open(self, path: str, durable: bool = False) -> Iterator[BinaryIO]:
        """``durable``: the data is fsynced before the rename (else a power cut could leave the
        new name on an empty or partial file), and the folder after it."""
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "wb") as handle:
                yield handle
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
                else:
                    start_writeback(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)
            raise
        if durable:
            fsync_path(folder)

    def make_durable(self, files: list[str], folders: list[str]) -> None:
        """The files' data, then the names in the folders. A file written by another process (a
        worker's shard) is fsynced all the same: fsync flushes the file, whoever wrote it.
        (Concurrent fsyncs, which ext4 may join into one journal commit, measured no faster
        here than these one after another.)"""
        for path in [*files, *folders]:
            fsync_path(path)

    def delete_files(self, paths: list[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def delete_folders(self, folders: dict[str, list[str]]) -> None:
        """Each folder as a tree: a local folder also holds what no listing showed (a writer's
        temporary file, empty sub-folders)."""
        for folder in folders:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(folder)


class ObjectPublisher:
    """Object stores publish an object when its upload completes: write in place, and on an
    error abort the upload rather than complete it with what was written so far."""

    concurrent_writes = 8

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs

    @contextlib.contextmanager
    def open(self, path: str, durable: bool = False) -> Iterator[BinaryIO]:
        """An object is written whole by its completing PUT (or multipart completion): atomic and,
        when it returns, durable; nothing to sync (``durable`` changes nothing)."""
        handle = self.fs.open(path, "wb")
        try:
            yield handle
        except BaseException:
            if isinstance(handle, AbstractBufferedFile):
                handle.discard()
                handle.closed = True  # closing would upload the partial buffer
            raise
        handle.close()

    def make_durable(self, files: list[str], folders: list[str]) -> None:
        """Nothing to do: an object exists, durably, once its PUT has completed."""

    def delete_files(self, paths: list[str]) -> None:
        """One bulk request per thousand keys (s3fs); a missing key is no error on S3."""
        if paths:
            self.fs.rm(paths)

    def delete_folders(self, folders: dict[str, list[str]]) -> None:
        """A folder of an object store is nothing but its keys: delete the listed ones in bulk,
        without listing again (a recursive ``rm`` lists each folder first). A key written after
        the listing stays, as a torn folder that the next prune removes."""
        self.delete_files([path for files in folders.values() for path in files])


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Linux: have the disk start writing the file's dirty pages now, without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``), so that the commit's fsync finds them written
    or in flight. Elsewhere nothing: the fsync then does all of it."""
    if _LIBC is not None:
        _LIBC.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), SYNC_FILE_RANGE_WRITE)


def fsync_path(path: str) -> None:
    """fsync a local file (its data) or folder (the names in it), opened read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_publisher(fs: fsspec.AbstractFileSystem) -> Publisher:
    return LocalPublisher() if isinstance(fs, LocalFileSystem) else ObjectPublisher(fs)


def read_whole(fs: fsspec.AbstractFileSystem, path: str, limit: int | None = None) -> bytes:
    """The whole file in one request (``FileNotFoundError`` if there is none). Asking from byte
    0 to the end matters on S3: without a range s3fs first asks for the size (a HEAD, plus a
    listing when the key is missing) to decide whether to fetch it in parallel chunks. With a
    ``limit``, at most ``limit + 1`` bytes are read (still one ranged GET), so that a caller can
    tell a file over its limit without holding all of it."""
    return fs.cat_file(path, start=0, end=None if limit is None else limit + 1)


def file_version(info: dict[str, Any]) -> tuple[Any, ...] | None:
    """What tells one content of a stored file from another without reading it: the size with
    the ETag on S3 (a new upload gets a new one) or the mtime and inode on disk. None when the
    filesystem reports neither (its files are then never trusted unread)."""
    stamp = (info.get("ETag"), info.get("mtime"), info.get("ino"))
    return None if stamp == (None, None, None) else (info.get("size"), *stamp)


def byte_view(data: Any) -> memoryview:
    """A flat byte view of any buffer (bytes, numpy array, pyarrow buffer), without a copy."""
    return memoryview(data).cast("B")


class Crc32:
    """CRC-32 (``zlib.crc32``) with hashlib's ``update`` / ``hexdigest`` interface."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def new_checksum(algorithm: str) -> Any:
    """A fresh checksum of ``algorithm`` (``crc32``, or ``sha256`` for format-1 manifests)."""
    if algorithm == "crc32":
        return Crc32()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum {algorithm!r} (known: crc32, sha256)")


class _Overlap:
    """Runs the checksum's ``update`` of one chunk on a helper thread while the caller moves the
    next. Updates stay in order: each waits for the previous one before it starts. A disabled
    one checksums nothing (a read that trusts an earlier verification)."""

    def __init__(self, enabled: bool = True, algorithm: str = CHECKSUM) -> None:
        self.algorithm = algorithm
        self.digest = new_checksum(algorithm)
        self.enabled = enabled
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def update(self, chunk: memoryview, overlap: bool = True) -> None:
        """Hash ``chunk`` next; ``overlap`` off when nothing will happen before the next
        ``wait`` (a hand-off to the helper thread would then only add its own cost)."""
        self.wait()
        if not self.enabled:
            return
        if not overlap or len(chunk) < INLINE_HASH_BYTES:
            self.digest.update(chunk)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-hash")
        self._pending = self._pool.submit(self.digest.update, chunk)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class HashingWriter:
    """Writes to ``handle`` and counts and hashes what it writes: the ``PartEntry`` of the file."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.size = 0
        self._hash = _Overlap()

    def write(self, data: Any) -> int:
        view = byte_view(data)
        try:
            for start in range(0, len(view), CHUNK_BYTES):
                chunk = view[start : start + CHUNK_BYTES]
                self._hash.update(chunk)
                self.handle.write(chunk)
                self.size += len(chunk)
        finally:
            self._hash.wait()  # the caller may reuse its buffer once write returns
        return len(view)

    def close(self) -> None:
        self._hash.close()

    def entry(self, relpath: str) -> PartEntry:
        self.close()
        return PartEntry(path=relpath, size=self.size, checksum=self._hash.digest.hexdigest(), algorithm=self._hash.algorithm)


class VerifiedReader:
    """Reads a stored file that must match its manifest entry; ``finish`` raises
    ``CheckpointCorruptError`` (naming ``label``) when its size or checksum do not. With
    ``check_content`` off only the size is checked (the caller verified the content already)."""

    def __init__(
        self, handle: io.BufferedIOBase, label: str, expected: PartEntry, check_content: bool = True
    ) -> None:
        self.handle = handle
        self.label = label
        self.expected = expected
        self.size = 0
        self._hash = _Overlap(enabled=check_content, algorithm=expected.algorithm)

    def read_all(self) -> bytes:
        """The rest of the file (small files: one read, hashed after it)."""
        data = self.handle.read()
        self._hash.update(memoryview(data), overlap=False)
        self.size += len(data)
        return data

    def read_exact(self, num_bytes: int) -> bytes:
        buffer = bytearray(num_bytes)
        self.readinto_exact(memoryview(buffer))
        return bytes(buffer)

    def readinto_exact(self, target: memoryview) -> None:
        """Fill ``target`` (a flat byte view), hashing each chunk while the next one is read."""
        try:
            for start in range(0, len(target), CHUNK_BYTES):
                chunk = target[start : start + CHUNK_BYTES]
                got = 0
                while got < len(chunk):
                    num_read = self.handle.readinto(chunk[got:])
                    if not num_read:
                        self.size += got
                        raise self.corrupt(
                            f"size {self.size} != {self.expected.size} in the manifest (ends early)"
                        )
                    got += num_read
                self._hash.update(chunk, overlap=start + CHUNK_BYTES < len(target))
                self.size += got
        finally:
            self._hash.wait()

    def copy_to(self, write: Callable[[memoryview], object]) -> None:
        """Pass the rest of the file to ``write`` chunk by chunk."""
        self.size += _pump(self.handle, self._hash, write, self.expected.size - self.size)

    def finish(self) -> None:
        """Check that the file ends here and that its checksum is the manifest's."""
        self._hash.close()
        rest = len(self.handle.read())
        if rest or self.size != self.expected.size:
            raise self.corrupt(f"size {self.size + rest} != {self.expected.size} in the manifest")
        digest = self._hash.digest.hexdigest()
        if self._hash.enabled and digest != self.expected.checksum:
            raise self.corrupt(
                f"checksum {self.expected.algorithm} {digest} != {self.expected.checksum} in the manifest"
            )

    def corrupt(self, problem: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{self.label}: {problem}")

    def close(self) -> None:
        self._hash.close()


def _pump(
    handle: io.BufferedIOBase, overlap: _Overlap, write: Callable[[memoryview], object] | None, expected_bytes: int
) -> int:
    """Read ``handle`` to its end in chunks, hashing each while the next is read (two buffers
    take turns) and passing it to ``write``; the number of bytes read. The buffers are no
    larger than the ``expected_bytes`` (the size the manifest or a listing gives): zeroing two
    chunk-sized buffers per file cost more than reading a small file. A file longer than
    expected is still read to its end, in chunks of that size."""
    chunk_bytes = max(1, min(CHUNK_BYTES, expected_bytes))
    buffers: list[bytearray] = []
    total, turn = 0, 0
    try:
        while True:
            if turn == len(buffers):
                buffers.append(bytearray(chunk_bytes))
            view = memoryview(buffers[turn])
            num_read = handle.readinto(view)
            if not num_read:
                return total
            # Waits for the previous chunk (the other buffer); the expected last one is hashed here.
            overlap.update(view[:num_read], overlap=total + num_read < expected_bytes)
            if write is not None:
                write(view[:num_read])
            total += num_read
            turn = 1 - turn
    finally:
        overlap.wait()


def hash_stored_file(
    fs: fsspec.AbstractFileSystem, path: str, expected_bytes: int, algorithm: str = CHECKSUM
) -> str:
    """The ``algorithm`` checksum of a stored file of about ``expected_bytes`` (see ``_pump``), streamed."""
    overlap = _Overlap(algorithm=algorithm)
    try:
        with fs.open(path, "rb") as handle:
            _pump(handle, overlap, None, expected_bytes)
    finally:
        overlap.close()
    return overlap.digest.hexdigest()
