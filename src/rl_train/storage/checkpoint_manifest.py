"""A checkpoint's ``manifest.json``: the list of its files with sizes and checksums, written last.

A step folder is a checkpoint only once its manifest exists and every file it lists has the
listed size and checksum. The manifest is the commit record: anything a reader finds without
one is a write that did not finish (a torn checkpoint), and anything that disagrees with it is
damage. Both are reported with the step folder and the file named, so that a user can tell a
killed write from a corrupted disk.

    {"format": 2, "step": 12, "created_unix": 1767225600.0,
     "files": {"actor/rank-0/model.safetensors": {"size": 1048576, "crc32": "3610a686"}},
     "meta": {...}}

The checksum guards against damage (a torn upload, a flipped bit, a truncated copy), not
against an attacker, so it is CRC-32 (format 2): ``zlib.crc32`` runs at several GB/s, faster
than a page-cache read here, where SHA-256 (format 1) ran at about 1.7 GB/s and capped a local
checkpoint's write and read at about half the speed of the same bytes written raw. Format 1
manifests (SHA-256) still read and verify.

A manifest is untrusted input (whoever can write the checkpoint store wrote it), so every
reader takes it through ``parse_manifest``, which checks its whole shape before anything is
opened: each file's path by the rule its writer obeyed (``check_part_path``: relative, posix,
no ``..`` or other dot-name, no empty part, backslash or NUL), each size a non-negative int,
each checksum the hex digest of a known algorithm, and bounded counts and lengths. A manifest
that fails is a damaged checkpoint (``CheckpointCorruptError``, naming the step folder, the key
and the fault), never a path to follow.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2
"""Bumped when the layout changes in a way an older reader would misread."""
READABLE_FORMATS = (1, 2)
CHECKSUM = "crc32"
"""The algorithm new manifests use; ``CHECKSUMS`` lists every one a manifest may name."""
CHECKSUMS = ("crc32", "sha256")
DIGEST_HEX_CHARS = {"crc32": 8, "sha256": 64}
MAX_MANIFEST_BYTES = 64 << 20
"""A manifest is read whole; one larger than this is refused before it is parsed (a manifest
of 100,000 files is about 10 MB)."""
MAX_MANIFEST_FILES = 100_000
MAX_PART_PATH_CHARS = 1024
MAX_PART_SIZE = (1 << 63) - 1
_HEX_DIGITS = frozenset("0123456789abcdef")


def part_path_problem(relpath: object) -> str | None:
    """Why ``relpath`` is not a checkpoint part's path, or None. The same rule holds on write
    and on read: a manifest whose keys break it was not written by a ``CheckpointStore``."""
    if not isinstance(relpath, str) or not relpath:
        return "not a non-empty string"
    if len(relpath) > MAX_PART_PATH_CHARS:
        return f"longer than {MAX_PART_PATH_CHARS} characters"
    if "\\" in relpath or "\0" in relpath:
        return "holds a backslash or NUL"
    if relpath.startswith("/"):
        return "absolute"
    parts = relpath.split("/")
    if any(part in ("..", ".") for part in parts):
        return "holds a '..' or '.' part"
    if any(not part for part in parts):
        return "holds an empty part"
    if any(part.startswith(".") for part in parts):
        return "holds a dot-name (reserved for temporary files)"
    if relpath == MANIFEST_NAME:
        return "is the manifest's own name"
    return None


def check_part_path(relpath: str) -> str:
    """A part's path: relative, posix, no ``..``, no dot-names (reserved for temporary files)."""
    problem = part_path_problem(relpath)
    if problem is not None:
        raise ValueError(
            f"a checkpoint part path is relative and posix, without dot-names: {relpath!r} {problem}"
        )
    return relpath


@dataclass(frozen=True)
class PartEntry:
    """One written file of a checkpoint, as its writer saw it: crosses Ray from the process that
    wrote it to the one that commits, so it stays a plain frozen dataclass."""

    path: str
    """Relative to the step folder, posix: ``actor/rank-0/model.safetensors``."""
    size: int
    checksum: str
    """Hex digest of the bytes written, computed while writing them."""
    algorithm: str = CHECKSUM
    """Which checksum ``checksum`` is (one of ``CHECKSUMS``)."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read as asked."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint is torn or damaged; the message names the step folder, the file and the fault."""


def build_manifest(step: int, parts: list[PartEntry], meta: dict[str, Any]) -> bytes:
    """The manifest of ``step`` listing ``parts``, as strict JSON (RFC 8259: no NaN)."""
    files: dict[str, dict[str, Any]] = {}
    for part in parts:
        entry = {"size": part.size, part.algorithm: part.checksum}
        if files.get(part.path, entry) != entry:
            raise CheckpointError(f"step {step}: two different parts named {part.path!r} in one commit")
        files[part.path] = entry
    document = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "created_unix": time.time(),
        "files": dict(sorted(files.items())),
        "meta": meta,
    }
    try:
        return json.dumps(document, allow_nan=False, indent=1).encode()
    except ValueError as error:
        raise CheckpointError(f"step {step}: the checkpoint meta is not strict JSON: {error}") from None


def parse_manifest(data: bytes, step: int) -> dict[str, Any]:
    """The manifest document in ``data``, checked to be one of ``step`` and well formed (see the
    module docstring); ``ValueError`` saying what is wrong otherwise, naming the key at fault."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, RecursionError, ValueError) as error:  # a 5,000-digit int: ValueError
        raise ValueError(f"bad manifest json ({type(error).__name__}: {str(error)[:200]})") from None
    if not isinstance(document, dict):
        raise ValueError("bad manifest json (not an object)")
    if document.get("format") not in READABLE_FORMATS or isinstance(document.get("format"), bool):
        known = " and ".join(map(str, READABLE_FORMATS))
        raise ValueError(
            f"unknown manifest format {str(document.get('format'))[:40]!r} (this reader knows {known})"
        )
    if document.get("step") != step or isinstance(document.get("step"), bool):
        raise ValueError(f"the manifest is of step {str(document.get('step'))[:40]!r}, not {step}")
    files = document.get("files")
    if not isinstance(files, dict):
        raise ValueError("bad manifest json (files must be an object)")
    if len(files) > MAX_MANIFEST_FILES:
        raise ValueError(f"bad manifest json ({len(files)} files, more than {MAX_MANIFEST_FILES})")
    for relpath, entry in files.items():
        problem = part_path_problem(relpath)
        if problem is not None:
            raise ValueError(f"bad manifest key {relpath[:200]!r}: {problem}")
        problem = _file_entry_problem(entry)
        if problem is not None:
            raise ValueError(f"bad manifest entry {relpath!r}: {problem}")
    if not isinstance(document.get("meta"), dict):
        raise ValueError("bad manifest json (meta must be an object)")
    return document


def _file_entry_problem(entry: Any) -> str | None:
    """Why a manifest's file entry is not a size with one checksum, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_PART_SIZE:
        return f"size must be an int from 0 to {MAX_PART_SIZE}"
    algorithms = [name for name in CHECKSUMS if name in entry]
    if len(algorithms) != 1 or set(entry) != {"size", *algorithms}:
        return f"must hold its size and exactly one checksum of {', '.join(CHECKSUMS)}, nothing else"
    digest = entry[algorithms[0]]
    if (
        not isinstance(digest, str)
        or len(digest) != DIGEST_HEX_CHARS[algorithms[0]]
        or set(digest) - _HEX_DIGITS
    ):
        return f"{algorithms[0]} must be {DIGEST_HEX_CHARS[algorithms[0]]} lowercase hex digits"
    return None


def manifest_parts(document: dict[str, Any]) -> dict[str, PartEntry]:
    """The files a parsed manifest lists, by relative path."""
    parts = {}
    for path, entry in document["files"].items():
        algorithm = next(name for name in CHECKSUMS if name in entry)
        parts[path] = PartEntry(path=path, size=entry["size"], checksum=entry[algorithm], algorithm=algorithm)
    return parts
