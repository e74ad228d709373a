"""Counting the S3 requests an operation makes.

A small checkpoint on S3 costs requests, not bytes: each one is a round trip, and the raw file
it is compared with is one PUT. So the bench prints the requests of each operation and the
tests bound them. s3fs sends every S3 call through one method of the filesystem
(``_call_s3``; its blocking twin ``call_s3`` is what a file being written uses); both are
wrapped on the instance for the duration of the block, so every call, by any user of that
instance, is counted by its API name (``put_object``, ``list_objects_v2``, ...).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.asyn import sync_wrapper


@contextlib.contextmanager
def count_s3_requests(fs: fsspec.AbstractFileSystem) -> Iterator[Counter[str]]:
    """Count the S3 calls made through ``fs`` (an s3fs filesystem) while the block runs: API
    name -> calls. Retries inside botocore are not counted: this is the store's own cost."""
    if "_call_s3" in vars(fs):
        raise RuntimeError("this filesystem's S3 calls are already being counted")
    counts: Counter[str] = Counter()
    original = fs._call_s3

    async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        counts[method] += 1
        return await original(method, *args, **kwargs)

    fs._call_s3 = counted
    fs.call_s3 = sync_wrapper(counted, obj=fs)
    try:
        yield counts
    finally:
        del fs._call_s3, fs.call_s3
