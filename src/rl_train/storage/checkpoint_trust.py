"""What a store instance remembers of the files it verified, so that it hashes each once.

A reader that calls ``latest_valid`` (content checked, as the crash harness does) hashes
every file of the checkpoint it picks, and then reads those files, each read checking its
checksum as it goes: every byte hashed twice. (A resume skips the first pass:
``latest_valid(content=False)`` reads no file, and its workers check each file as they load
it.) A read may skip the hash when the file is the one that was verified, which needs no read
of it: its version (size and ETag on S3, where a new upload gets a new ETag; size, mtime and
inode on disk), as the verifying listing saw it, is compared with the file's version now.

The trust is this instance's: the memory is not pickled with the store (``CheckpointStore``
sends a copy off empty), and other processes, which read their own parts through their own
store, hash what they read. The risk taken: a file rewritten in place with the same size
within the timestamp granularity of a local filesystem (a few milliseconds), or replaced on S3
between the version check and the read (two requests), is read unchecked. Nothing in this code
rewrites a committed file, and a resume reads within seconds of verifying.
"""

from __future__ import annotations

from typing import Any

import fsspec

from rl_train.storage.checkpoint_io import CHUNK_BYTES, file_version

TRUSTED_READ_MIN_BYTES = CHUNK_BYTES
"""Only files from this size up are trusted: checking that a file is unchanged costs a stat, or
on S3 a HEAD request, which is more than hashing a small file costs."""


class VerifiedFiles:
    """(step, relative path) -> the version of a file whose size and checksum were checked."""

    def __init__(self) -> None:
        self._versions: dict[tuple[int, str], tuple[Any, ...]] = {}

    def remember(self, step: int, infos: dict[str, dict[str, Any]]) -> None:
        """The files of ``step`` (relative path -> the listing's info) passed verification."""
        for relpath, info in infos.items():
            version = file_version(info)
            if version is not None:
                self._versions[(step, relpath)] = version

    def forget(self, step: int) -> None:
        for key in [key for key in self._versions if key[0] == step]:
            del self._versions[key]

    def unchanged(self, fs: fsspec.AbstractFileSystem, path: str, step: int, relpath: str, size: int) -> bool:
        """Whether the file at ``path`` (``relpath`` of ``step``, ``size`` bytes in the
        manifest) passed verification and has the same version now, asked of the store."""
        version = self._versions.get((step, relpath))
        if version is None or size < TRUSTED_READ_MIN_BYTES:
            return False
        fs.invalidate_cache(path)  # s3fs would answer from the listing that verify made
        try:
            return file_version(fs.info(path)) == version
        except FileNotFoundError:
            return False
