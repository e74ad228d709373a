"""A checkpoint's ``manifest.json``: the list of its files with sizes and checksums, written last.

A step folder is a checkpoint only once its manifest exists and every file it lists has the
listed size and SHA-256. The manifest is the commit record: anything a reader finds without
one is a write that did not finish (a torn checkpoint), and anything that disagrees with it is
damage. Both are reported with the step folder and the file named, so that a user can tell a
killed write from a corrupted disk.

    {"format": 1, "step": 12, "created_unix": 1767225600.0,
     "files": {"actor/rank-0/model.safetensors": {"size": 1048576, "sha256": "9f86d0..."}},
     "meta": {...}}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
"""Bumped when the layout changes in a way an older reader would misread."""


@dataclass(frozen=True)
class PartEntry:
    """One written file of a checkpoint, as its writer saw it: crosses Ray from the process that
    wrote it to the one that commits, so it stays a plain frozen dataclass."""

    path: str
    """Relative to the step folder, posix: ``actor/rank-0/model.safetensors``."""
    size: int
    sha256: str
    """Hex digest of the bytes written, computed while writing them."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read as asked."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint is torn or damaged; the message names the step folder, the file and the fault."""


def build_manifest(step: int, parts: list[PartEntry], meta: dict[str, Any]) -> bytes:
    """The manifest of ``step`` listing ``parts``, as strict JSON (RFC 8259: no NaN)."""
    files: dict[str, dict[str, Any]] = {}
    for part in parts:
        entry = {"size": part.size, "sha256": part.sha256}
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
    """The manifest document in ``data``, checked to be one of ``step``; ``ValueError`` saying
    what is wrong otherwise."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"bad manifest json ({error})") from None
    if not isinstance(document, dict):
        raise ValueError("bad manifest json (not an object)")
    if document.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"unknown manifest format {document.get('format')!r} (this reader knows 1)")
    if document.get("step") != step:
        raise ValueError(f"the manifest is of step {document.get('step')!r}, not {step}")
    files = document.get("files")
    if not isinstance(files, dict) or not all(_is_file_entry(entry) for entry in files.values()):
        raise ValueError("bad manifest json (files must map each path to its size and sha256)")
    if not isinstance(document.get("meta"), dict):
        raise ValueError("bad manifest json (meta must be an object)")
    return document


def _is_file_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("size"), int)
        and not isinstance(entry.get("size"), bool)
        and isinstance(entry.get("sha256"), str)
    )


def manifest_parts(document: dict[str, Any]) -> dict[str, PartEntry]:
    """The files a parsed manifest lists, by relative path."""
    return {
        path: PartEntry(path=path, size=entry["size"], sha256=entry["sha256"])
        for path, entry in document["files"].items()
    }
