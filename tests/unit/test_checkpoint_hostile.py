"""A checkpoint store is untrusted input: a manifest written by someone else must not steer a
read or a copy outside its folder, and a malformed one is a damaged checkpoint, never a crash.

Each attack is the finding as it was reproduced: a manifest key ``policy/../../../../payload.txt``
made ``download_dir`` write outside its destination. Every reader of a manifest (``manifest``,
``verify``, ``latest_valid`` as a resume calls it, the reads, ``download_dir``) now refuses it
with an error naming the checkpoint and the key, and nothing lands outside. Local writes are
made durable in order before the manifest appears (fsync recorded).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from rl_train.storage import checkpoint_manifest
from rl_train.storage.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStore,
    step_dir_name,
)
from rl_train.storage.checkpoint_manifest import MANIFEST_NAME, parse_manifest

WEIGHTS = b"weights" * 100


def _committed(root: Path, step: int = 1) -> CheckpointStore:
    """A checkpoint of ``step`` with a policy folder and a second part, committed as a run does."""
    store = CheckpointStore(str(root))
    parts = [
        store.write_bytes(step, "policy/model.safetensors", WEIGHTS),
        store.write_bytes(step, "policy/sub/config.json", b"{}"),
        store.write_json(step, "run/driver.json", {"step": step}),
    ]
    store.commit(step, parts, {"step": step})
    return store


def _rewrite_manifest(root: Path, step: int, edit: Any) -> None:
    """Change the manifest on disk behind the store's back, as whoever can write the store could."""
    path = root / step_dir_name(step) / MANIFEST_NAME
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


def _add_key(key: str) -> Any:
    def edit(document: dict[str, Any]) -> None:
        document["files"][key] = document["files"]["policy/model.safetensors"]

    return edit


def _files_under(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


HOSTILE_KEYS = {
    "policy/../../../../payload.txt": "'..'",
    "/tmp/rlt-hostile/payload.txt": "absolute",
    "policy/..\\..\\payload.txt": "backslash",
    "policy//payload.txt": "empty part",
    "policy/pay\x00load.txt": "NUL",
    "policy/./payload.txt": "'.'",
    "": "non-empty",
}


@pytest.mark.parametrize("key", list(HOSTILE_KEYS))
def test_a_traversing_manifest_key_is_refused_by_every_reader(key: str, tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "c" / "ckpt"
    _committed(root, 1)
    _committed(root, 2)
    _rewrite_manifest(root, 2, _add_key(key))
    why = HOSTILE_KEYS[key]
    store = CheckpointStore(str(root))  # a fresh reader: a resume's or an evaluation's

    with pytest.raises(CheckpointCorruptError, match="step-00000002/manifest.json") as caught:
        store.manifest(2)
    assert repr(key)[:20].strip("'") in str(caught.value) and why in str(caught.value)
    problems = store.verify(2)
    assert len(problems) == 1 and "bad manifest key" in problems[0] and why in problems[0]
    with pytest.raises(CheckpointCorruptError, match="bad manifest key"):
        store.read_bytes(2, "policy/model.safetensors")
    assert store.latest_valid(content=False) == 1  # a resume skips it, with a warning naming it
    assert store.latest_valid() == 1

    dest = tmp_path / "x1" / "x2" / "x3" / "x4" / "dest"
    before = _files_under(tmp_path)
    with pytest.raises(CheckpointCorruptError, match="bad manifest key"):
        store.download_dir(2, "policy", dest)
    assert _files_under(tmp_path) == before  # nothing written, inside or out
    assert not dest.exists()
    assert not (tmp_path / "x1" / "payload.txt").exists()


def test_a_resume_skips_the_hostile_checkpoint_with_a_warning_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    _committed(root, 1)
    _committed(root, 2)
    _rewrite_manifest(root, 2, _add_key("policy/../../../../payload.txt"))
    with caplog.at_level(logging.WARNING, logger="rl_train.storage.checkpoint"):
        assert CheckpointStore(str(root)).latest_valid(content=False) == 1
    assert "step-00000002" in caplog.text and "policy/../../../../payload.txt" in caplog.text


def test_the_download_writes_nowhere_but_its_destination_when_it_holds_a_symlink_out(tmp_path: Path) -> None:
    """A destination that already holds a link (planted, or left by an earlier copy) cannot carry
    the copy outside it: a folder that resolves outside is refused, and so is a file link."""
    store = _committed(tmp_path / "ckpt")
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CheckpointError, match="'policy/sub/config.json'.*outside"):
        store.download_dir(1, "policy", dest)
    assert _files_under(outside) == set()

    dest2 = tmp_path / "dest2"
    dest2.mkdir()
    (dest2 / "model.safetensors").symlink_to(outside / "stolen.bin")
    with pytest.raises(CheckpointError, match="'policy/model.safetensors'"):
        store.download_dir(1, "policy", dest2)
    assert _files_under(outside) == set()


def test_a_destination_that_is_itself_a_symlink_is_resolved_and_written_inside(tmp_path: Path) -> None:
    store = _committed(tmp_path / "ckpt")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    store.download_dir(1, "policy", tmp_path / "link")
    assert _files_under(real) == {"model.safetensors", "sub/config.json"}
    assert (real / "model.safetensors").read_bytes() == WEIGHTS


def _manifest(files: Any, **extra: Any) -> bytes:
    return json.dumps(
        {"format": 2, "step": 3, "created_unix": 0.0, "files": files, "meta": {}, **extra}
    ).encode()


GOOD_ENTRY = {"size": 3, "crc32": "0a1b2c3d"}
BAD_MANIFESTS = {
    "negative size": (_manifest({"a/b": {"size": -1, "crc32": "0a1b2c3d"}}), "size must be an int"),
    "bool size": (_manifest({"a/b": {"size": True, "crc32": "0a1b2c3d"}}), "size must be an int"),
    "float size": (_manifest({"a/b": {"size": 3.0, "crc32": "0a1b2c3d"}}), "size must be an int"),
    "short digest": (_manifest({"a/b": {"size": 3, "crc32": "0a1b"}}), "8 lowercase hex"),
    "not hex": (_manifest({"a/b": {"size": 3, "crc32": "zzzzzzzz"}}), "8 lowercase hex"),
    "two checksums": (
        _manifest({"a/b": {"size": 3, "crc32": "0a1b2c3d", "sha256": "0" * 64}}),
        "exactly one checksum",
    ),
    "extra field": (_manifest({"a/b": {**GOOD_ENTRY, "path": "/etc/passwd"}}), "nothing else"),
    "files a list": (_manifest([["a/b", GOOD_ENTRY]]), "files must be an object"),
    "deep nesting": (b"[" * 100_000, "bad manifest json"),
    "huge integer": (b'{"format": 2, "step": ' + b"9" * 5000 + b"}", "bad manifest json"),
    "bool format": (_manifest({}, format=True), "unknown manifest format"),
    "not utf-8": (b"\xff\xfe{}", "bad manifest json"),
    "manifest's own name": (_manifest({MANIFEST_NAME: GOOD_ENTRY}), "manifest's own name"),
    "long key": (_manifest({"a/" + "x" * 2000: GOOD_ENTRY}), "longer than"),
}


@pytest.mark.parametrize("case", list(BAD_MANIFESTS))
def test_a_malformed_manifest_is_refused_with_what_is_wrong(case: str) -> None:
    data, why = BAD_MANIFESTS[case]
    with pytest.raises(ValueError, match=why):
        parse_manifest(data, 3)


def test_counts_and_sizes_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_manifest, "MAX_MANIFEST_FILES", 2)
        with pytest.raises(ValueError, match="3 files, more than 2"):
            parse_manifest(_manifest({f"a/{i}": GOOD_ENTRY for i in range(3)}), 3)
        assert parse_manifest(_manifest({"a/b": GOOD_ENTRY}), 3)["files"] == {"a/b": GOOD_ENTRY}

    root = tmp_path / "ckpt"
    _committed(root, 1)
    size = (root / step_dir_name(1) / MANIFEST_NAME).stat().st_size
    monkeypatch.setattr("rl_train.storage.checkpoint.MAX_MANIFEST_BYTES", size - 1)  # read at most that + 1
    monkeypatch.setattr(checkpoint_manifest, "MAX_MANIFEST_BYTES", size - 1)  # and refused
    with pytest.raises(
        CheckpointCorruptError, match="step-00000001/manifest.json: the manifest is larger than"
    ):
        CheckpointStore(str(root)).manifest(1)


def test_a_part_path_breaking_the_rule_is_refused_on_write_too(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    for key in ("policy/../x", "/abs", "a\\b", "a//b", "a/\x00", ".hidden", MANIFEST_NAME):
        with pytest.raises(ValueError, match="a checkpoint part path is relative and posix"):
            store.write_bytes(1, key, b"x")
    assert _files_under(tmp_path) == set()


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_local_files_and_folders_are_fsynced_before_the_manifest_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order a power cut needs: every part's data, then the folders holding their names,
    then the manifest's data, its rename, and last the step folder that names it."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", _fd_path(fd)))
        real_fsync(fd)

    def replace(source: Any, target: Any) -> None:
        events.append(("rename", str(target)))
        real_replace(source, target)

    root = (tmp_path / "ckpt").resolve()
    store = CheckpointStore(str(root))
    parts = [
        store.write_bytes(4, "actor/rank-0/model.safetensors", WEIGHTS),
        store.write_bytes(4, "queue/records.parquet", b"rows"),
    ]
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.commit(4, parts, {})

    step_folder = root / step_dir_name(4)
    manifest = step_folder / MANIFEST_NAME
    renamed = events.index(("rename", str(manifest)))
    before, after = events[:renamed], events[renamed + 1 :]
    synced_before = [path for kind, path in before if kind == "fsync"]
    part_files = [str(step_folder / part.path) for part in parts]
    folders = [str(step_folder / "actor" / "rank-0"), str(step_folder / "actor"), str(step_folder / "queue")]
    assert set(part_files) | set(folders) | {str(step_folder), str(root)} <= set(synced_before)
    last_part = max(synced_before.index(path) for path in part_files)
    assert all(synced_before.index(folder) > last_part for folder in folders)  # data, then names
    manifest_data = [path for path in synced_before if Path(path).name.startswith(f".{MANIFEST_NAME}.")]
    assert len(manifest_data) == 1 and synced_before[-1] == manifest_data[0]  # the manifest's data last
    assert after == [("fsync", str(step_folder))]  # then the name of the manifest in its folder
    assert store.verify(4) == []


def test_an_object_store_has_nothing_to_fsync(
    s3_root: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 an object appears whole, durably, when its PUT completes: no fsync is made."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    root, options = s3_root
    store = CheckpointStore(root, storage_options=options)
    store.commit(1, [store.write_bytes(1, "policy/model.safetensors", WEIGHTS)], {})
    assert calls == [] and store.verify(1) == []
