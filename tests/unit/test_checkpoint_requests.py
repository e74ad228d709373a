"""What a checkpoint costs on S3 in requests, and reads that trust an earlier verification.

A small checkpoint on S3 costs requests, not bytes (the raw file it is measured against is one
PUT), so the counts are bounded here: a regression that asks the store again per part, lists
twice or deletes folder by folder fails. The counts come from a real S3 server (moto's), every
call s3fs makes counted by its API name.
"""

from __future__ import annotations

import pickle
import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.bench.s3_requests import count_s3_requests
from rl_train.storage import checkpoint_io, checkpoint_trust
from rl_train.storage.checkpoint import CheckpointCorruptError, CheckpointError, CheckpointStore, PartEntry

NUM_PARTS = 3


def _write_parts(store: CheckpointStore, step: int) -> list[PartEntry]:
    """``NUM_PARTS`` parts of every kind a trainer writes (a state is one file)."""
    return [
        store.write_tensors(step, "actor/rank-0/model.safetensors", {"w": torch.full((256,), float(step))}),
        *store.write_state(step, "actor/rank-0/optimizer", {"state": {0: {"m": torch.ones(8)}}, "lr": 0.1}),
        store.write_bytes(step, "queue/records.parquet", bytes(1000)),
    ]


def _checkpoint(store: CheckpointStore, step: int) -> None:
    store.commit(step, _write_parts(store, step), {"step": step})


def _counted_checkpoint(store: CheckpointStore, step: int) -> Counter[str]:
    """The S3 requests of one checkpoint: its parts written and committed by ``store``."""
    with count_s3_requests(store.fs) as counts:
        _checkpoint(store, step)
    return counts


def test_a_checkpoint_of_k_parts_costs_k_plus_3_requests(s3_root: tuple[str, dict[str, Any]]) -> None:
    """K part PUTs, one GET asking whether the step is committed (not one per part), one
    listing of the root for the commit and its prune, the manifest's PUT: no HEAD, no second
    listing."""
    root, options = s3_root
    store = CheckpointStore(root, keep_last=2, storage_options=options)
    for step in (1, 2):
        counts = _counted_checkpoint(store, step)
        assert counts == {"put_object": NUM_PARTS + 1, "get_object": 1, "list_objects_v2": 1}, step


def test_a_prune_costs_two_deletes_however_many_steps_go(s3_root: tuple[str, dict[str, Any]]) -> None:
    """The manifests of the doomed steps in one bulk delete, then the rest of their files in
    another, both from the commit's listing (a recursive rm lists each folder first)."""
    root, options = s3_root
    keeper = CheckpointStore(root, keep_last=10, storage_options=options)
    for step in (1, 2, 3):
        _checkpoint(keeper, step)
    keeper.write_bytes(4, "x.bin", b"torn: killed before its commit")
    store = CheckpointStore(root, keep_last=1, storage_options=options)
    counts = _counted_checkpoint(store, 5)  # prunes 1, 2, 3 (retention) and 4 (torn, older)
    assert counts == {"put_object": NUM_PARTS + 1, "get_object": 1, "list_objects_v2": 1, "delete_objects": 2}
    assert store.complete_steps() == [5]
    store.fs.invalidate_cache()
    assert store.fs.find(store.root) == store.fs.find(store.step_uri(5))


def test_a_worker_asks_once_per_step_and_store(s3_root: tuple[str, dict[str, Any]]) -> None:
    """A process writing its own parts through its own store: one GET, then a PUT per part."""
    root, options = s3_root
    worker = CheckpointStore(root, storage_options=options)
    with count_s3_requests(worker.fs) as counts:
        parts = _write_parts(worker, 1) + [worker.write_bytes(1, "rng/rank-1.bin", b"r")]
    assert counts == {"get_object": 1, "put_object": NUM_PARTS + 1}
    CheckpointStore(root, storage_options=options).commit(1, parts, {})


def test_a_resume_costs_a_listing_a_manifest_and_a_get_per_file_read(s3_root: tuple[str, dict[str, Any]]) -> None:
    """``latest_valid`` on a fresh store: one listing, the manifest, one GET per file hashed;
    then each read one GET (a whole small file: no HEAD first)."""
    root, options = s3_root
    _checkpoint(CheckpointStore(root, storage_options=options), 1)
    store = CheckpointStore(root, storage_options=options)
    store.fs.invalidate_cache()  # as a fresh process: nothing listed yet
    with count_s3_requests(store.fs) as counts:
        assert store.latest_valid() == 1
    assert counts == {"list_objects_v2": 1, "get_object": 1 + NUM_PARTS}
    with count_s3_requests(store.fs) as counts:
        store.read_bytes(1, "queue/records.parquet")
    assert counts == {"get_object": 1}


def test_a_fresh_store_refuses_to_write_into_a_step_another_committed(
    tmp_path: Path, s3_root: tuple[str, dict[str, Any]]
) -> None:
    for root, options in ((str(tmp_path / "ckpt"), None), s3_root):
        _checkpoint(CheckpointStore(root, storage_options=options), 1)
        late = CheckpointStore(root, storage_options=options)
        with pytest.raises(CheckpointError, match="step-00000001 is committed"):
            late.write_bytes(1, "late.bin", b"x")
        with pytest.raises(CheckpointError, match="already committed"):
            late.commit(1, [], {})


class _CountingChecksum:
    """A checkpoint_io checksum that counts the bytes it is given."""

    hashed = 0

    def __init__(self, algorithm: str) -> None:
        self._hash = _real_new_checksum(algorithm)

    def update(self, data: Any) -> None:
        _CountingChecksum.hashed += memoryview(data).nbytes
        self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


_real_new_checksum = checkpoint_io.new_checksum


@pytest.fixture
def hashed_bytes(monkeypatch: pytest.MonkeyPatch) -> type[_CountingChecksum]:
    _CountingChecksum.hashed = 0
    monkeypatch.setattr(checkpoint_io, "new_checksum", _CountingChecksum)
    return _CountingChecksum


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return str(tmp_path / "ckpt"), None
    return request.getfixturevalue("s3_root")


def _commit_two_files(root: str, options: dict[str, Any] | None) -> tuple[bytes, torch.Tensor]:
    store = CheckpointStore(root, storage_options=options)
    blob, weight = bytes(range(256)) * 64, torch.arange(4096, dtype=torch.float32)
    parts = [store.write_bytes(1, "blob.bin", blob), store.write_tensors(1, "w.safetensors", {"w": weight})]
    store.commit(1, parts, {})
    return blob, weight


def test_reads_after_latest_valid_do_not_hash_again(
    store_root: tuple[str, dict[str, Any] | None],
    hashed_bytes: type[_CountingChecksum],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checkpoint_trust, "TRUSTED_READ_MIN_BYTES", 0)
    root, options = store_root
    blob, weight = _commit_two_files(root, options)
    store = CheckpointStore(root, storage_options=options)
    hashed_bytes.hashed = 0
    assert store.latest_valid() == 1
    sizes = {path: entry["size"] for path, entry in store.manifest(1)["files"].items()}
    assert hashed_bytes.hashed == sum(sizes.values())  # every file hashed once, by latest_valid

    hashed_bytes.hashed = 0
    assert store.read_bytes(1, "blob.bin") == blob
    assert torch.equal(store.read_tensors(1, "w.safetensors")["w"], weight)
    assert hashed_bytes.hashed == 0

    copy = pickle.loads(pickle.dumps(store))  # another process trusts nothing it did not check
    assert copy.read_bytes(1, "blob.bin") == blob
    assert hashed_bytes.hashed == len(blob)


def test_a_file_changed_after_verification_is_hashed_again(
    store_root: tuple[str, dict[str, Any] | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new size (and on S3 a new ETag, whatever the size) ends the trust: the read hashes."""
    monkeypatch.setattr(checkpoint_trust, "TRUSTED_READ_MIN_BYTES", 0)
    root, options = store_root
    _commit_two_files(root, options)
    store = CheckpointStore(root, storage_options=options)
    assert store.latest_valid() == 1
    blob_path = f"{store._path(1)}/blob.bin"
    store.fs.pipe_file(blob_path, store.fs.cat_file(blob_path)[:-10])
    with pytest.raises(CheckpointCorruptError, match="blob.bin: size 16374 != 16384"):
        store.read_bytes(1, "blob.bin")
    if options is not None:  # S3: a rewrite of the same size has a new ETag
        tensor_path = f"{store._path(1)}/w.safetensors"
        data = bytearray(store.fs.cat_file(tensor_path))
        data[-1] ^= 0x40
        store.fs.pipe_file(tensor_path, bytes(data))
        with pytest.raises(CheckpointCorruptError, match="w.safetensors: checksum crc32"):
            store.read_tensors(1, "w.safetensors")


def test_small_files_are_hashed_again_rather_than_checked(
    s3_root: tuple[str, dict[str, Any]], hashed_bytes: type[_CountingChecksum]
) -> None:
    """Below TRUSTED_READ_MIN_BYTES a HEAD costs more than the hash: a read hashes, no HEAD."""
    root, options = s3_root
    blob, _ = _commit_two_files(root, options)
    store = CheckpointStore(root, storage_options=options)
    assert store.latest_valid() == 1
    hashed_bytes.hashed = 0
    with count_s3_requests(store.fs) as counts:
        assert store.read_bytes(1, "blob.bin") == blob
    assert counts == {"get_object": 1}
    assert hashed_bytes.hashed == len(blob)


def test_prune_removes_what_a_killed_local_writer_left(tmp_path: Path) -> None:
    """A torn local folder may hold only a temporary file and empty folders: prune removes it."""
    store = CheckpointStore(str(tmp_path / "ckpt"), keep_last=1)
    torn = Path(store._path(2))
    (torn / "actor" / "rank-0").mkdir(parents=True)
    (torn / "actor" / ".model.safetensors.0123.tmp").write_bytes(b"half")
    _checkpoint(store, 3)
    assert not torn.exists()
    assert store.complete_steps() == [3]


def test_parts_written_concurrently_on_s3_ask_once_and_keep_their_order(
    s3_root: tuple[str, dict[str, Any]],
) -> None:
    """On an object store the parts of one write go at once (a barrier that needs all three
    inside it together would time out one at a time); the step is still asked about once, and
    the entries come back in the order given."""
    root, options = s3_root
    store = CheckpointStore(root, storage_options=options)
    together = threading.Barrier(3, timeout=10)

    def part(name: str) -> Callable[[], PartEntry]:
        def write() -> PartEntry:
            together.wait()
            return store.write_bytes(1, name, name.encode())

        return write

    with count_s3_requests(store.fs) as counts:
        parts = store.write_concurrently([part("a.bin"), part("b.bin"), part("c.bin")])
    assert [p.path for p in parts] == ["a.bin", "b.bin", "c.bin"]
    assert counts == {"get_object": 1, "put_object": 3}
    store.commit(1, parts, {})
    assert store.read_bytes(1, "b.bin") == b"b.bin"


def test_a_failed_concurrent_part_is_raised_after_the_others_end(s3_root: tuple[str, dict[str, Any]]) -> None:
    root, options = s3_root
    store = CheckpointStore(root, storage_options=options)

    def broken() -> PartEntry:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        store.write_concurrently([broken, partial(store.write_bytes, 1, "late.bin", bytes(100_000))])
    store.fs.invalidate_cache()
    assert store.fs.exists(f"{store.step_uri(1)}/late.bin")  # it ended; nothing runs behind the caller


def test_parts_on_local_disk_are_written_one_after_another(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    threads = []

    def write(name: str) -> PartEntry:
        threads.append(threading.current_thread())
        return store.write_bytes(1, name, b"x")

    parts = store.write_concurrently([partial(write, "a.bin"), partial(write, "b.bin")])
    assert [p.path for p in parts] == ["a.bin", "b.bin"]
    assert threads == [threading.main_thread()] * 2
