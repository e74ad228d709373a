"""The checkpoint store of a run: step folders of parts, each committed by a manifest written last.

    <root>/step-00000012/actor/rank-0/model.safetensors
    <root>/step-00000012/queue/records.parquet
    <root>/step-00000012/manifest.json          <- written last: the commit

``root`` is a local folder or ``s3://bucket/prefix``; the URI decides, and both go through the
same code (``checkpoint_io``). Any process may write parts (a Ray worker writes its own shard
straight to storage and hands back a small ``PartEntry``); one process commits, listing every
part with its size and checksum. Readers only ever see committed steps, and ``latest_valid``
checks the files against the manifest, so a step torn by a kill or damaged afterwards is
skipped with a warning that names it and what is wrong, and the previous one is used.

A committed checkpoint is immutable. A step folder without a manifest is a write that did not
finish: a resumed run may write into it again, and ``prune`` removes it once a newer step is
committed (never before: it may be the one being written). Folders not named ``step-<8 digits>``
(an ``eval/`` beside them) are not the store's and are left alone.

On S3 a small checkpoint costs requests rather than bytes, so a store instance remembers what
cannot have changed behind it: the manifests it read or wrote, the steps it found uncommitted
(asked once per step, not once per part), and the files it verified (``checkpoint_trust``). A
commit lists the root once and prunes from that listing: a checkpoint of K parts written and
committed by one instance costs K + 3 requests, plus two deletes when it prunes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from rl_train.storage.background_writer import BackgroundWriter
from rl_train.storage.checkpoint_download import open_target, plan_targets
from rl_train.storage.checkpoint_folders import (
    StepFolder,
    list_step_folder,
    list_step_folders,
    parse_step_dir,
    select_pruned_steps,
    step_dir_name,
)
from rl_train.storage.checkpoint_io import (
    HashingWriter,
    VerifiedReader,
    build_publisher,
    hash_stored_file,
    open_filesystem,
    read_whole,
)
from rl_train.storage.checkpoint_manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    CheckpointCorruptError,
    CheckpointError,
    PartEntry,
    build_manifest,
    check_part_path,
    manifest_parts,
    parse_manifest,
)
from rl_train.storage.checkpoint_trust import VerifiedFiles

if TYPE_CHECKING:  # torch is imported where tensors are written or read: a run's driver
    import torch  # plans its start (fresh, resume) from this module before it needs torch

__all__ = [
    "BackgroundWriter",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointStore",
    "PartEntry",
    "parse_step_dir",
    "select_pruned_steps",
    "step_dir_name",
]

logger = logging.getLogger(__name__)

STATE_FORMAT = 2
"""1: the skeleton in ``<relpath>.json`` beside the tensor file (still read); 2: in its metadata."""
STATE_METADATA_KEY = "rl_train.state"


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
        self._open_steps: set[int] = set()
        """Steps found uncommitted: only this run's committer commits them, after their parts."""
        self._verified = VerifiedFiles()
        self._check_lock = threading.Lock()

    def _forget(self, step: int) -> None:
        """Drop what is known of ``step``: its folder was deleted or moved, or is re-verified."""
        self._manifests.pop(step, None)
        self._open_steps.discard(step)
        self._verified.forget(step)

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to another process asks the store afresh instead of trusting our memory."""
        state = self.__dict__.copy()
        state.update(_manifests={}, _open_steps=set(), _verified=VerifiedFiles())
        del state["_check_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _check_lock=threading.Lock())

    def step_uri(self, step: int) -> str:
        return f"{self.root}/{step_dir_name(step)}"

    def _path(self, step: int, relpath: str = "") -> str:
        folder = f"{self._root}/{step_dir_name(step)}"
        return f"{folder}/{relpath}" if relpath else folder

    # Writers: callable from any process.

    def _check_writable(self, step: int) -> None:
        """Refuse a write into a committed step. The store is asked (one GET of the manifest:
        a HEAD of a missing key is followed by a listing on S3) at the first write of a step by
        this instance, not at every part: the manifest is written only by the run's committer
        once every part is written, so a step found uncommitted stays so until this instance
        commits it (or, wrongly, another run sharing the root does: that is not caught here)."""
        with self._check_lock:  # concurrent writes of one step ask once
            committed = step in self._manifests
            if not committed and step not in self._open_steps:
                try:
                    read_whole(self.fs, self._path(step, MANIFEST_NAME), limit=MAX_MANIFEST_BYTES)
                    committed = True
                except FileNotFoundError:
                    self._open_steps.add(step)
        if committed:
            raise CheckpointError(f"{self.step_uri(step)} is committed; a committed checkpoint is immutable")

    def _write(self, step: int, relpath: str, produce: Callable[[HashingWriter], object]) -> PartEntry:
        check_part_path(relpath)
        self._check_writable(step)
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
        from rl_train.storage.tensor_file import write_tensor_file

        return self._write(step, relpath, lambda writer: write_tensor_file(writer.write, tensors, metadata))

    def write_state(self, step: int, relpath: str, state: Any) -> list[PartEntry]:
        """A nested state as one file, ``<relpath>.safetensors``: its tensors, and the rest as
        strict JSON in the file's metadata (see ``state_pack`` for what round-trips and how).
        One file, not a tensor file and a JSON file: on S3 each file is a request."""
        from rl_train.storage.state_pack import pack_state

        skeleton, tensors = pack_state(state)
        document = json.dumps({"format": STATE_FORMAT, "state": skeleton}, allow_nan=False)
        return [self.write_tensors(step, f"{relpath}.safetensors", tensors, {STATE_METADATA_KEY: document})]

    def write_concurrently(self, writes: Sequence[Callable[[], PartEntry | list[PartEntry]]]) -> list[PartEntry]:
        """Run several part writes at once (each a ``write_*`` call bound to its arguments) and
        return their entries in the order given. On an object store each part is at least one
        request, and a small checkpoint costs its requests' latency more than its bytes; on local
        disk they run one after another (``Publisher.concurrent_writes``). Every write has ended
        when this returns; the first error is raised after all of them."""
        workers = min(len(writes), self._publisher.concurrent_writes)
        if workers <= 1:
            results = [write() for write in writes]
        else:
            with ThreadPoolExecutor(workers, "checkpoint-part") as pool:
                futures = [pool.submit(write) for write in writes]
            results = [future.result() for future in futures]
        return [entry for result in results for entry in (result if isinstance(result, list) else [result])]

    def commit(self, step: int, parts: list[PartEntry], meta: dict[str, Any]) -> None:
        """Write the manifest listing ``parts`` and ``meta``, then prune. The manifest appears
        at once or not at all (local: a renamed temporary file; S3: one PUT). Every part must
        be in the step folder with its size, so that no commit names a file it lacks. One
        listing of the root shows that, whether the step is committed already, and what to
        prune."""
        already = CheckpointError(f"{self.step_uri(step)} is already committed; a committed checkpoint is immutable")
        if step in self._manifests:
            raise already
        data = build_manifest(step, parts, meta)
        folders = list_step_folders(self.fs, self._root)
        folder = folders.setdefault(step, StepFolder())
        if folder.committed:
            raise already
        stored = {relpath: info["size"] for relpath, info in folder.files.items()}
        problems = [
            f"{part.path} is {'missing' if part.path not in stored else f'{stored[part.path]} bytes, not {part.size}'}"
            for part in parts
            if stored.get(part.path) != part.size
        ]
        if problems:
            raise CheckpointError(f"cannot commit {self.step_uri(step)}: " + "; ".join(problems))
        # Durable in order (local disk; an object store's PUT is): the parts' data, the names in
        # their folders, then the manifest's data, its rename, and the step folder's name for it.
        self._publisher.make_durable(
            sorted({self._path(step, part.path) for part in parts}), self._part_folders(step, parts)
        )
        with self._publisher.open(self._path(step, MANIFEST_NAME), durable=True) as handle:
            handle.write(data)
        self._manifests[step] = parse_manifest(data, step)
        self._open_steps.discard(step)
        folder.files[MANIFEST_NAME] = {"size": len(data)}
        try:
            self._prune(folders)
        except Exception:  # housekeeping: the checkpoint itself is committed
            logger.warning("pruning old checkpoints under %s failed", self.root, exc_info=True)

    def _part_folders(self, step: int, parts: list[PartEntry]) -> list[str]:
        """Every folder whose names a commit of ``parts`` relies on, deepest first: each part's
        folder and those above it, up to the step folder and the root that holds it."""
        folders = {self._root, self._path(step)}
        for part in parts:
            relfolder = part.path.rpartition("/")[0]
            while relfolder:
                folders.add(self._path(step, relfolder))
                relfolder = relfolder.rpartition("/")[0]
        return sorted(folders, key=lambda folder: (-folder.count("/"), folder))

    # Readers.

    def _step_folders(self) -> dict[int, bool]:
        """Every step folder under the root -> whether it holds a manifest (no checksums)."""
        return {step: folder.committed for step, folder in list_step_folders(self.fs, self._root).items()}

    def complete_steps(self) -> list[int]:
        """Steps whose folder holds a manifest, ascending; cheap (checks no file)."""
        return sorted(step for step, committed in self._step_folders().items() if committed)

    def _torn(self, step: int) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{self.step_uri(step)}: {MANIFEST_NAME} missing (a write that did not finish)")

    def _load_manifest(self, step: int) -> dict[str, Any]:
        try:
            data = read_whole(self.fs, self._path(step, MANIFEST_NAME), limit=MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            raise self._torn(step) from None
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
        return self._verify(step, None)

    def _verify(self, step: int, folder: StepFolder | None, content: bool = True) -> list[str]:
        """``verify``, from ``folder`` when a listing of the root already shows it. A pass
        remembers each file's version, so that reads of it need not hash it again. With
        ``content`` off only the manifest, the files' presence and their sizes are checked
        (from the listing, no file is read), and nothing is remembered: reads check the rest."""
        self._forget(step)
        if folder is not None and not folder.committed:
            return [str(self._torn(step))]
        try:
            document = self._load_manifest(step)
        except CheckpointCorruptError as error:
            return [str(error)]
        stored = (folder or list_step_folder(self.fs, self._path(step))).files
        problems = []
        for relpath, entry in manifest_parts(document).items():
            label = f"{self.step_uri(step)}/{relpath}"
            size = stored[relpath]["size"] if relpath in stored else None
            if size is None:
                problems.append(f"{label}: missing")
            elif size != entry.size:
                problems.append(f"{label}: size {size} != {entry.size} in the manifest")
            elif content:
                digest = hash_stored_file(self.fs, self._path(step, relpath), size, entry.algorithm)
                if digest != entry.checksum:
                    problems.append(
                        f"{label}: checksum {entry.algorithm} {digest} != {entry.checksum} in the manifest"
                    )
        if not problems:
            self._manifests[step] = document
            if content:
                self._verified.remember(step, {relpath: stored[relpath] for relpath in document["files"]})
        return problems

    def latest_valid(self, content: bool = True, below: int | None = None) -> int | None:
        """The newest step (below ``below``, when given) whose checkpoint verifies; each newer
        one (torn or damaged) is skipped with a warning naming its folder and its problems.
        Reads of the step it returns trust that verification (see ``checkpoint_trust``).

        ``content=False`` checks the manifest and each file's presence and size from one
        listing, without reading the files: what a resume does, whose workers then check each
        checksum as they read (one pass over the bytes instead of two) and fall back to an
        older checkpoint when one does not match."""
        folders = list_step_folders(self.fs, self._root)
        for step in sorted(folders, reverse=True):
            if below is not None and step >= below:
                continue
            problems = self._verify(step, folders[step], content)
            if not problems:
                return step
            logger.warning("skipping checkpoint %s: %s", self.step_uri(step), "; ".join(problems))
        return None

    def _part(self, step: int, relpath: str) -> tuple[PartEntry, str]:
        """The manifest entry of a committed part, and the label that errors name it by."""
        parts = manifest_parts(self._cached_manifest(step))
        label = f"{self.step_uri(step)}/{relpath}"
        if relpath not in parts:
            raise CheckpointError(f"{label}: not in the checkpoint (the manifest does not list it)")
        return parts[relpath], label

    def _still_verified(self, step: int, relpath: str, entry: PartEntry) -> bool:
        """Whether ``verify`` passed this file in this instance and it is unchanged since: then
        reading it need not hash it again (``checkpoint_trust`` says what risk that takes)."""
        return self._verified.unchanged(self.fs, self._path(step, relpath), step, relpath, entry.size)

    @contextlib.contextmanager
    def _open_verified(self, step: int, relpath: str) -> Iterator[VerifiedReader]:
        """A reader of a committed part; its size and (unless ``_still_verified``) its checksum
        are checked when the block ends."""
        entry, label = self._part(step, relpath)
        check_content = not self._still_verified(step, relpath, entry)
        try:
            handle = self.fs.open(self._path(step, relpath), "rb")
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{label}: missing") from None
        with handle:
            reader = VerifiedReader(handle, label, entry, check_content)
            try:
                yield reader
                reader.finish()
            finally:
                reader.close()

    def read_bytes(self, step: int, relpath: str) -> bytes:
        """The whole file in one request (a streamed read costs a HEAD first on S3), checked."""
        entry, label = self._part(step, relpath)
        check_content = not self._still_verified(step, relpath, entry)
        try:
            data = read_whole(self.fs, self._path(step, relpath))
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{label}: missing") from None
        with contextlib.closing(VerifiedReader(io.BytesIO(data), label, entry, check_content)) as reader:
            reader.read_all()
            reader.finish()
        return data

    def read_json(self, step: int, relpath: str) -> Any:
        return json.loads(self.read_bytes(step, relpath))

    def read_table(self, step: int, relpath: str) -> pa.Table:
        return pq.read_table(pa.BufferReader(self.read_bytes(step, relpath)))

    def read_tensors(self, step: int, relpath: str) -> dict[str, torch.Tensor]:
        return self._read_tensor_file(step, relpath)[0]

    def _read_tensor_file(self, step: int, relpath: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        from rl_train.storage.tensor_file import TensorFileError, read_tensor_file

        with self._open_verified(step, relpath) as reader:
            try:
                return read_tensor_file(reader.read_exact, reader.readinto_exact, reader.expected.size)
            except TensorFileError as error:
                raise reader.corrupt(str(error)) from None

    def read_state(self, step: int, relpath: str) -> Any:
        tensors, metadata = self._read_tensor_file(step, f"{relpath}.safetensors")
        if STATE_METADATA_KEY in metadata:
            where, document = f"{relpath}.safetensors", json.loads(metadata[STATE_METADATA_KEY])
        else:  # format 1
            where, document = f"{relpath}.json", self.read_json(step, f"{relpath}.json")
        if not isinstance(document, dict) or document.get("format") not in (1, STATE_FORMAT):
            raise CheckpointCorruptError(f"{self.step_uri(step)}/{where}: not a state skeleton")
        from rl_train.storage.state_pack import unpack_state

        return unpack_state(document["state"], tensors)

    def download_dir(self, step: int, relprefix: str, dest: str | Path) -> Path:
        """Copy the committed files under ``relprefix`` (``policy/``) to the local folder ``dest``,
        each checked against the manifest (``transformers`` wants a local path). Where each file
        lands is checked before any is written: nothing is written outside ``dest``
        (``checkpoint_download``)."""
        prefix = relprefix.strip("/") + "/" if relprefix.strip("/") else ""
        parts = [p for p in manifest_parts(self._cached_manifest(step)) if p.startswith(prefix)]
        if not parts:
            raise CheckpointError(f"{self.step_uri(step)} holds no files under {relprefix!r}")
        root, targets = plan_targets(self.step_uri(step), dest, prefix, parts)
        for relpath, target in targets.items():
            with (
                self._open_verified(step, relpath) as reader,
                open_target(self.step_uri(step), root, relpath, target) as out,
            ):
                reader.copy_to(out.write)
        return Path(dest)

    def prune(self) -> list[int]:
        """Delete committed checkpoints outside the retention and torn folders older than the
        newest committed one (see ``select_pruned_steps``); the deleted steps."""
        return self._prune(list_step_folders(self.fs, self._root))

    def _prune(self, folders: dict[int, StepFolder]) -> list[int]:
        """``prune`` from a listing of the root (a commit's). Two deletes in all, however many
        steps go: their manifests first, so that a delete cut short leaves torn folders, never a
        damaged checkpoint; then the rest of their files (on S3 in bulk, as listed)."""
        complete = [step for step, folder in folders.items() if folder.committed]
        torn = [step for step, folder in folders.items() if not folder.committed]
        doomed = select_pruned_steps(complete, torn, self.keep_last, self.keep_every)
        self._publisher.delete_files(
            [self._path(step, MANIFEST_NAME) for step in doomed if folders[step].committed]
        )
        self._publisher.delete_folders(
            {
                self._path(step): [
                    self._path(step, relpath) for relpath in folders[step].files if relpath != MANIFEST_NAME
                ]
                for step in doomed
            }
        )
        for step in doomed:
            self._forget(step)
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
            self._forget(newer)
            moved.append(target)
        return moved
