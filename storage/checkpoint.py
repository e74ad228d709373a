"""The checkpoint store of a run: step folders of parts, each committed by a manifest written last.

    <root>/step-00000012/actor/rank-0/model.safetensors
    <root>/step-00000012/queue/records.parquet
    <root>/step-00000012/manifest.json          <- written last: the commit

``root`` is a local folder or ``s3://bucket/prefix``; the URI decides, and both go through the
same code (``checkpoint_io``). Any process may write parts (a Ray worker writes its own shard
straight to storage and hands back a small ``PartEntry``); one process commits, listing every
part with its size and SHA-256. Readers only ever see committed steps, and ``latest_valid``
checks the files against the manifest, so a step torn by a kill or damaged afterwards is
skipped with a warning that names it and what is wrong, and the previous one is used.

A committed checkpoint is immutable. A step folder without a manifest is a write that did not
finish: a resumed run may write into it again, and ``prune`` removes it once a newer step is
committed (never before: it may be the one being written). Folders not named ``step-<8 digits>``
(an ``eval/`` beside them) are not the store's and are left alone.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rl_train.storage.background_writer import BackgroundWriter
from rl_train.storage.checkpoint_io import (
    HashingWriter,
    VerifiedReader,
    build_publisher,
    hash_stored_file,
    open_filesystem,
)
from rl_train.storage.checkpoint_manifest import (
    MANIFEST_NAME,
    CheckpointCorruptError,
    CheckpointError,
    PartEntry,
    build_manifest,
    manifest_parts,
    parse_manifest,
)
from rl_train.storage.state_pack import pack_state, unpack_state
from rl_train.storage.tensor_file import TensorFileError, read_tensor_file, write_tensor_file

__all__ = [
    "BackgroundWriter",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointStore",
    "PartEntry",
    "select_pruned_steps",
    "step_dir_name",
]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step-(\d{8,})")
STATE_FORMAT = 1


def step_dir_name(step: int) -> str:
    """``step-00000012``: zero-padded so that folder names sort as steps do."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step is an int >= 0, not {step!r}")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step of a folder named by ``step_dir_name``; None for any other name."""
    match = _STEP_DIR.fullmatch(name)
    if match is None or step_dir_name(int(match[1])) != name:
        return None
    return int(match[1])


def select_pruned_steps(complete: list[int], torn: list[int], keep_last: int, keep_every: int) -> list[int]:
    """The steps ``prune`` deletes: committed ones neither among the newest ``keep_last`` nor a
    multiple of ``keep_every`` (0: none kept that way), and torn ones older than the newest
    committed step."""
    newest = sorted(complete)[-keep_last:]
    kept = set(newest) | {s for s in complete if keep_every and s % keep_every == 0}
    doomed = [s for s in complete if s not in kept]
    if complete:
        doomed += [s for s in torn if s < max(complete)]
    return sorted(doomed)


def _check_relpath(relpath: str) -> str:
    """A part's path: relative, posix, no ``..``, no dot-names (reserved for temporary files)."""
    parts = relpath.split("/")
    if "\\" in relpath or any(not part or part.startswith(".") for part in parts) or relpath == MANIFEST_NAME:
        raise ValueError(f"a checkpoint part path is relative and posix, without dot-names: {relpath!r}")
    return relpath


class CheckpointStore:
    """Writers and readers of one run's checkpoints under ``root`` (see the module docstring)."""

    def __init__(
        self,
        root: str,
        *,
        keep_last: int = 3,
        keep_every: int = 0,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        """``keep_last``: the newest N committed checkpoints are kept; ``keep_every``: so is
        every step that is a multiple of M (0: off). ``storage_options`` go to fsspec."""
        if keep_last < 1 or keep_every < 0:
            raise ValueError(f"keep_last must be >= 1 and keep_every >= 0, not {keep_last}, {keep_every}")
        self.root = root.rstrip("/")
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.storage_options = storage_options
        self.fs, self._root = open_filesystem(root, storage_options)
        self._publisher = build_publisher(self.fs)
        self._manifests: dict[int, dict[str, Any]] = {}
        """Manifests already read and found valid; a committed checkpoint does not change."""

    def step_uri(self, step: int) -> str:
        return f"{self.root}/{step_dir_name(step)}"

    def _path(self, step: int, relpath: str = "") -> str:
        folder = f"{self._root}/{step_dir_name(step)}"
        return f"{folder}/{relpath}" if relpath else folder

    def _exists_now(self, path: str) -> bool:
        """Exists, asked of the store (another process may have written it since we looked)."""
        self.fs.invalidate_cache(path)
        return self.fs.exists(path)

    # Writers: callable from any process.

    def _write(self, step: int, relpath: str, produce: Callable[[HashingWriter], None]) -> PartEntry:
        _check_relpath(relpath)
        if self._exists_now(self._path(step, MANIFEST_NAME)):
            raise CheckpointError(f"{self.step_uri(step)} is committed; a committed checkpoint is immutable")
        with self._publisher.open(self._path(step, relpath)) as handle:
            writer = HashingWriter(handle)
            try:
                produce(writer)
            finally:
                writer.close()
        return writer.entry(relpath)

    def write_bytes(self, step: int, relpath: str, data: bytes) -> PartEntry:
        return self._write(step, relpath, lambda writer: writer.write(data))

    def write_json(self, step: int, relpath: str, obj: Any) -> PartEntry:
        """Strict JSON (RFC 8259): a NaN or infinity is refused, not written as a bare token."""
        try:
            data = json.dumps(obj, allow_nan=False).encode()
        except ValueError as error:
            raise ValueError(f"{relpath}: not strict JSON ({error})") from None
        return self.write_bytes(step, relpath, data)

    def write_table(self, step: int, relpath: str, table: pa.Table) -> PartEntry:
        """Parquet, encoded in memory first: the file is smaller than the table it encodes."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        return self.write_bytes(step, relpath, sink.getvalue())

    def write_tensors(
        self,
        step: int,
        relpath: str,
        tensors: dict[str, torch.Tensor],
        metadata: dict[str, str] | None = None,
    ) -> PartEntry:
        """A safetensors file, streamed one tensor at a time; bit-exact for every dtype."""
        return self._write(step, relpath, lambda writer: write_tensor_file(writer.write, tensors, metadata))

    def write_state(self, step: int, relpath: str, state: Any) -> list[PartEntry]:
        """A nested state: its tensors to ``<relpath>.safetensors``, the rest to ``<relpath>.json``
        (see ``state_pack`` for what round-trips and how)."""
        skeleton, tensors = pack_state(state)
        name = relpath.rsplit("/", 1)[-1]
        return [
            self.write_tensors(step, f"{relpath}.safetensors", tensors),
            self.write_json(
                step,
                f"{relpath}.json",
                {"format": STATE_FORMAT, "tensors": f"{name}.safetensors", "state": skeleton},
            ),
        ]

    def commit(self, step: int, parts: list[PartEntry], meta: dict[str, Any]) -> None:
        """Write the manifest listing ``parts`` and ``meta``, then prune. The manifest appears
        at once or not at all (local: a renamed temporary file; S3: one PUT). Every part must
        be in the step folder with its size, so that no commit names a file it lacks."""
        manifest_path = self._path(step, MANIFEST_NAME)
        if self._exists_now(manifest_path):
            raise CheckpointError(
                f"{self.step_uri(step)} is already committed; a committed checkpoint is immutable"
            )
        data = build_manifest(step, parts, meta)
        stored = self._stored_sizes(step)
        problems = [
            f"{part.path} is {'missing' if part.path not in stored else f'{stored[part.path]} bytes, not {part.size}'}"
            for part in parts
            if stored.get(part.path) != part.size
        ]
        if problems:
            raise CheckpointError(f"cannot commit {self.step_uri(step)}: " + "; ".join(problems))
        with self._publisher.open(manifest_path) as handle:
            handle.write(data)
        self._manifests[step] = parse_manifest(data, step)
        try:
            self.prune()
        except Exception:  # housekeeping: the checkpoint itself is committed
            logger.warning("pruning old checkpoints under %s failed", self.root, exc_info=True)

    # Readers.

    def _step_folders(self) -> dict[int, bool]:
        """Every step folder under the root -> whether it holds a manifest (no checksums). One
        recursive listing: on S3 that is one request per thousand objects, where a listing
        bounded in depth costs a request per folder."""
        try:
            found = self.fs.find(self._root, withdirs=True, refresh=True)
        except FileNotFoundError:
            return {}
        folders: dict[int, bool] = {}
        for path in found:
            parts = path[len(self._root) + 1 :].split("/")
            step = parse_step_dir(parts[0])
            if step is not None:
                folders[step] = folders.get(step, False) or parts[1:] == [MANIFEST_NAME]
        return folders

    def _stored_sizes(self, step: int) -> dict[str, int]:
        """Relative path -> size of every file now in the step folder."""
        folder = self._path(step)
        try:
            found = self.fs.find(folder, detail=True, refresh=True)
        except FileNotFoundError:
            return {}
        return {path[len(folder) + 1 :]: info["size"] for path, info in found.items()}

    def complete_steps(self) -> list[int]:
        """Steps whose folder holds a manifest, ascending; cheap (checks no file)."""
        return sorted(step for step, committed in self._step_folders().items() if committed)

    def _load_manifest(self, step: int) -> dict[str, Any]:
        path = self._path(step, MANIFEST_NAME)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise CheckpointCorruptError(
                f"{self.step_uri(step)}: {MANIFEST_NAME} missing (a write that did not finish)"
            ) from None
        try:
            return parse_manifest(data, step)
        except ValueError as error:
            raise CheckpointCorruptError(f"{self.step_uri(step)}/{MANIFEST_NAME}: {error}") from None

    def _cached_manifest(self, step: int) -> dict[str, Any]:
        if step not in self._manifests:
            self._manifests[step] = self._load_manifest(step)
        return self._manifests[step]

    def manifest(self, step: int) -> dict[str, Any]:
        """The parsed manifest of a committed step; ``CheckpointCorruptError`` if it has none."""
        return copy.deepcopy(self._cached_manifest(step))

    def verify(self, step: int) -> list[str]:
        """What is wrong with the checkpoint of ``step``, each naming its file; [] when it is
        complete: the manifest parses, and every listed file has its size and checksum."""
        try:
            document = self._load_manifest(step)
        except CheckpointCorruptError as error:
            return [str(error)]
        stored = self._stored_sizes(step)
        problems = []
        for relpath, entry in manifest_parts(document).items():
            label = f"{self.step_uri(step)}/{relpath}"
            if relpath not in stored:
                problems.append(f"{label}: missing")
            elif stored[relpath] != entry.size:
                problems.append(f"{label}: size {stored[relpath]} != {entry.size} in the manifest")
            else:
                digest = hash_stored_file(self.fs, self._path(step, relpath))
                if digest != entry.sha256:
                    problems.append(f"{label}: checksum sha256 {digest} != {entry.sha256} in the manifest")
        if not problems:
            self._manifests[step] = document
        return problems

    def latest_valid(self) -> int | None:
        """The newest step whose checkpoint verifies; each newer one (torn or damaged) is
        skipped with a warning naming its folder and its problems."""
        for step in sorted(self._step_folders(), reverse=True):
            problems = self.verify(step)
            if not problems:
                return step
            logger.warning("skipping checkpoint %s: %s", self.step_uri(step), "; ".join(problems))
        return None

    @contextlib.contextmanager
    def _open_verified(self, step: int, relpath: str) -> Iterator[VerifiedReader]:
        """A reader of a committed part; its size and checksum are checked when the block ends."""
        parts = manifest_parts(self._cached_manifest(step))
        label = f"{self.step_uri(step)}/{relpath}"
        if relpath not in parts:
            raise CheckpointError(f"{label}: not in the checkpoint (the manifest does not list it)")
        try:
            handle = self.fs.open(self._path(step, relpath), "rb")
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{label}: missing") from None
        with handle:
            reader = VerifiedReader(handle, label, parts[relpath])
            try:
                yield reader
                reader.finish()
            finally:
                reader.close()

    def read_bytes(self, step: int, relpath: str) -> bytes:
        with self._open_verified(step, relpath) as reader:
            return reader.read_all()

    def read_json(self, step: int, relpath: str) -> Any:
        return json.loads(self.read_bytes(step, relpath))

    def read_table(self, step: int, relpath: str) -> pa.Table:
        return pq.read_table(pa.BufferReader(self.read_bytes(step, relpath)))

    def read_tensors(self, step: int, relpath: str) -> dict[str, torch.Tensor]:
        with self._open_verified(step, relpath) as reader:
            try:
                tensors, _ = read_tensor_file(reader.read_exact, reader.readinto_exact, reader.expected.size)
            except TensorFileError as error:
                raise reader.corrupt(str(error)) from None
            return tensors

    def read_state(self, step: int, relpath: str) -> Any:
        document = self.read_json(step, f"{relpath}.json")
        if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
            raise CheckpointCorruptError(f"{self.step_uri(step)}/{relpath}.json: not a state skeleton")
        return unpack_state(document["state"], self.read_tensors(step, f"{relpath}.safetensors"))

    def download_dir(self, step: int, relprefix: str, dest: str | Path) -> Path:
        """Copy the committed files under ``relprefix`` (``policy/``) to the local folder ``dest``,
        each checked against the manifest (``transformers`` wants a local path)."""
        prefix = relprefix.strip("/") + "/" if relprefix.strip("/") else ""
        parts = [p for p in manifest_parts(self._cached_manifest(step)) if p.startswith(prefix)]
        if not parts:
            raise CheckpointError(f"{self.step_uri(step)} holds no files under {relprefix!r}")
        dest = Path(dest)
        for relpath in parts:
            target = dest / relpath[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._open_verified(step, relpath) as reader, open(target, "wb") as out:
                reader.copy_to(out.write)
        return dest

    def prune(self) -> list[int]:
        """Delete committed checkpoints outside the retention and torn folders older than the
        newest committed one (see ``select_pruned_steps``); the deleted steps."""
        folders = self._step_folders()
        complete = [step for step, committed in folders.items() if committed]
        torn = [step for step, committed in folders.items() if not committed]
        doomed = select_pruned_steps(complete, torn, self.keep_last, self.keep_every)
        for step in doomed:
            # The manifest first: a delete cut short leaves a torn folder, not a damaged checkpoint.
            if folders[step]:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(self._path(step, MANIFEST_NAME))
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._path(step), recursive=True)
            self._manifests.pop(step, None)
        return doomed

    def set_aside_after(self, step: int) -> list[str]:
        """Move every step folder newer than ``step`` (torn, or committed but failing ``verify``)
        out of the store's sight, to ``<folder>.abandoned-<unix time>``: a run resumed from
        ``step`` redoes those steps and must commit fresh checkpoints under their names. Nothing
        is deleted: a damaged checkpoint stays there to be looked at. Returns the new paths."""
        moved = []
        stamp = int(time.time())
        for newer in sorted(s for s in self._step_folders() if s > step):
            target = f"{self._path(newer).rstrip('/')}.abandoned-{stamp}"
            self.fs.mv(self._path(newer).rstrip("/"), target, recursive=True)
            self._manifests.pop(newer, None)
            moved.append(target)
        return moved
