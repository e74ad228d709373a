"""The checkpoint store, on local disk and on a real local S3 server, through the same tests.

Every test that takes ``store_root`` runs twice: a local folder and an ``s3://`` bucket of
moto's server. Damage is done through the store's own filesystem, so it reaches S3 too.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import multiprocessing
import pickle
import random
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import safetensors.torch
import torch

from rl_train.storage.checkpoint import (
    BackgroundWriter,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStore,
    PartEntry,
    select_pruned_steps,
    step_dir_name,
)

StoreFactory = Callable[..., CheckpointStore]


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return str(tmp_path / "ckpt"), None
    return request.getfixturevalue("s3_root")


@pytest.fixture
def make_store(store_root: tuple[str, dict[str, Any] | None]) -> StoreFactory:
    root, options = store_root

    def make(**kwargs: Any) -> CheckpointStore:
        return CheckpointStore(root, storage_options=options, **kwargs)

    return make


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so that NaN payloads and -0.0 count too."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _commit_small(store: CheckpointStore, step: int) -> list[PartEntry]:
    parts = [
        store.write_bytes(step, "blob.bin", bytes(range(256)) * 8),
        store.write_tensors(step, "actor/rank-0/model.safetensors", {"w": torch.full((64,), float(step))}),
        store.write_json(step, "meta/loader.json", {"position": step}),
    ]
    store.commit(step, parts, {"step": step})
    return parts


def test_step_dir_name() -> None:
    assert step_dir_name(12) == "step-00000012"
    with pytest.raises(ValueError):
        step_dir_name(-1)


def test_bytes_json_table_round_trip(make_store: StoreFactory) -> None:
    store = make_store()
    blob = bytes(random.Random(0).randbytes(3 << 20))  # over the in-line hashing threshold
    table = pa.table({"uid": ["a", "b"], "prompt_ids": [[1, 2], [3]], "reward": [0.5, None]})
    parts = [
        store.write_bytes(3, "blob.bin", blob),
        store.write_json(3, "a/b.json", {"x": [1, 2.5, None], "n": 10**20}),
        store.write_table(3, "queue/records.parquet", table),
    ]
    assert parts[0].size == len(blob)
    store.commit(3, parts, {"note": "x"})

    assert store.read_bytes(3, "blob.bin") == blob
    assert store.read_json(3, "a/b.json") == {"x": [1, 2.5, None], "n": 10**20}
    assert store.read_table(3, "queue/records.parquet").equals(table)
    manifest = store.manifest(3)
    assert manifest["step"] == 3 and manifest["meta"] == {"note": "x"}
    assert manifest["files"]["blob.bin"] == {"size": parts[0].size, "crc32": parts[0].checksum}
    assert manifest["format"] == 2 and parts[0].checksum == f"{zlib.crc32(blob):08x}"
    assert store.complete_steps() == [3] and store.verify(3) == [] and store.latest_valid() == 3


@pytest.mark.parametrize("big_numel", [1 << 10, 3 << 20], ids=["staged", "streamed"])
def test_tensors_round_trip_bit_exact(make_store: StoreFactory, big_numel: int) -> None:
    """Both read paths: a small file read at once and copied out, a large one (12 MiB of
    float32 over the 8 MiB staging limit) read straight into each tensor."""
    store = make_store()
    base = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    nan_payload = torch.tensor([0x7FC00001, -0x003FFEDD], dtype=torch.int32).view(torch.float32)
    tensors = {
        "bf16": base.to(torch.bfloat16),
        "fp16_transposed": base.to(torch.float16).t(),  # non-contiguous
        "f32_sliced": base[:, ::3],  # non-contiguous
        "f32_nan_payloads": torch.cat([nan_payload, torch.tensor([-0.0, float("inf")])]),
        "f64_scalar": torch.tensor(3.25, dtype=torch.float64),
        "i64": torch.arange(-5, 5),
        "u8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8": base.to(torch.float8_e4m3fn),
        "empty": torch.empty(0, 3),
        "big": torch.randn(big_numel),  # 12 MiB: hashed on the helper thread
    }
    entry = store.write_tensors(1, "t.safetensors", tensors, metadata={"format": "pt"})
    store.commit(1, [entry], {})
    back = store.read_tensors(1, "t.safetensors")
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(_bits(back[name]), _bits(tensor)), name


def test_tensor_files_are_safetensors_both_ways(make_store: StoreFactory) -> None:
    """Our streamed files load with the safetensors package, and its files read with ours."""
    store = make_store()
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7), "c": torch.ones(2, 2)}
    ours = store.write_tensors(1, "ours.safetensors", tensors, metadata={"k": "v"})
    theirs = store.write_bytes(1, "theirs.safetensors", safetensors.torch.save(tensors))
    store.commit(1, [ours, theirs], {})
    loaded = safetensors.torch.load(store.read_bytes(1, "ours.safetensors"))
    read = store.read_tensors(1, "theirs.safetensors")
    for name, tensor in tensors.items():
        assert torch.equal(_bits(loaded[name]), _bits(tensor))
        assert torch.equal(_bits(read[name]), _bits(tensor))


def _adamw_after(steps: int, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(steps):
        _train_step(model, optimizer, step)
    return model, optimizer


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    inputs = torch.randn(8, 5, generator=torch.Generator().manual_seed(100 + step))
    optimizer.zero_grad()
    model(inputs).pow(2).mean().backward()
    optimizer.step()


def test_optimizer_state_round_trip_continues_bit_equal(make_store: StoreFactory) -> None:
    store = make_store()
    model, optimizer = _adamw_after(2)
    parts = store.write_state(2, "actor/rank-0/optimizer", optimizer.state_dict())
    assert [p.path for p in parts] == ["actor/rank-0/optimizer.safetensors"]  # the skeleton in its metadata
    store.commit(2, parts, {})

    restored_model = copy.deepcopy(model)
    restored = torch.optim.AdamW(restored_model.parameters(), lr=0.5)  # loading sets lr back
    state = store.read_state(2, "actor/rank-0/optimizer")
    assert list(state["state"]) == [0, 1, 2, 3]  # int keys stay ints
    restored.load_state_dict(state)
    _train_step(model, optimizer, 2)
    _train_step(restored_model, restored, 2)
    for ours, theirs in zip(model.parameters(), restored_model.parameters(), strict=True):
        assert torch.equal(_bits(ours.detach()), _bits(theirs.detach()))


def test_rng_states_restore_exactly(make_store: StoreFactory) -> None:
    store = make_store()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    generator = np.random.default_rng(4)
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "numpy_generator": generator.bit_generator.state,
        "torch": torch.get_rng_state(),
    }
    expected = (random.random(), np.random.rand(3), generator.random(3), torch.rand(3))
    store.commit(5, store.write_state(5, "rng/rank-0", states), {})

    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # scramble
    back = store.read_state(5, "rng/rank-0")
    random.setstate(back["python"])
    np.random.set_state(back["numpy"])
    fresh = np.random.default_rng(0)
    fresh.bit_generator.state = back["numpy_generator"]
    torch.set_rng_state(back["torch"])
    assert random.random() == expected[0]
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    np.testing.assert_array_equal(fresh.random(3), expected[2])
    assert torch.equal(torch.rand(3), expected[3])


def test_a_state_written_as_two_files_still_reads(make_store: StoreFactory) -> None:
    """Format 1 kept the skeleton in ``<relpath>.json`` beside the tensor file."""
    store = make_store()
    state = {"step": 3, "moments": (torch.arange(4.0), float("inf"))}
    skeleton = {"step": 3, "moments": {"__tuple__": [{"__tensor__": "t0"}, {"__float__": "inf"}]}}
    parts = [
        store.write_tensors(1, "rank-0/engine.safetensors", {"t0": torch.arange(4.0)}),
        store.write_json(1, "rank-0/engine.json", {"format": 1, "tensors": "engine.safetensors", "state": skeleton}),
    ]
    store.commit(1, parts, {})
    back = store.read_state(1, "rank-0/engine")
    assert back["step"] == 3 and torch.equal(back["moments"][0], state["moments"][0])
    assert back["moments"][1] == float("inf")


def test_state_refuses_a_value_it_cannot_keep(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    with pytest.raises(TypeError, match=r"state\['sched'\]\[1\]"):
        store.write_state(1, "x", {"sched": [1, object()]})


def test_write_json_refuses_nan(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not strict JSON"):
        CheckpointStore(str(tmp_path)).write_json(1, "m.json", {"loss": float("nan")})


@pytest.mark.parametrize("relpath", ["../x", "/abs", "a//b", "a/.hidden", "manifest.json", "a\\b"])
def test_part_paths_are_checked(tmp_path: Path, relpath: str) -> None:
    with pytest.raises(ValueError, match="relative and posix"):
        CheckpointStore(str(tmp_path)).write_bytes(1, relpath, b"x")


def test_torn_folder_is_skipped_with_a_warning(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    _commit_small(store, 1)
    store.write_bytes(2, "blob.bin", b"half a checkpoint")  # no manifest: killed before commit
    assert store.complete_steps() == [1]
    with caplog.at_level(logging.WARNING, logger="rl_train.storage.checkpoint"):
        assert store.latest_valid() == 1
    assert "step-00000002" in caplog.text and "manifest.json missing" in caplog.text
    with pytest.raises(CheckpointCorruptError, match="step-00000002: manifest.json missing"):
        store.read_bytes(2, "blob.bin")


def _truncate(store: CheckpointStore, path: str) -> str:
    store.fs.pipe_file(path, store.fs.cat_file(path)[:-10])
    return "size 2038 != 2048 in the manifest"


def _delete(store: CheckpointStore, path: str) -> str:
    store.fs.rm(path)
    return "missing"


def _flip_byte(store: CheckpointStore, path: str) -> str:
    data = bytearray(store.fs.cat_file(path))
    data[100] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
    return "checksum crc32"


@pytest.mark.parametrize("damage", [_truncate, _delete, _flip_byte])
def test_damaged_file_is_named_and_the_previous_step_used(
    make_store: StoreFactory, damage: Callable[[CheckpointStore, str], str], caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    _commit_small(store, 1)
    _commit_small(store, 2)
    store.read_bytes(2, "meta/loader.json")  # the reader has seen step 2's manifest: no stale pass
    fault = damage(store, f"{store._path(2)}/blob.bin")

    problems = store.verify(2)
    assert len(problems) == 1
    assert problems[0].startswith(f"{store.step_uri(2)}/blob.bin: {fault}")
    with caplog.at_level(logging.WARNING, logger="rl_train.storage.checkpoint"):
        assert store.latest_valid() == 1
    assert f"{store.step_uri(2)}/blob.bin: {fault}" in caplog.text
    with pytest.raises(CheckpointCorruptError, match=f"step-00000002/blob.bin: {fault}"):
        store.read_bytes(2, "blob.bin")
    assert store.read_bytes(1, "blob.bin") == bytes(range(256)) * 8


@pytest.mark.parametrize("damage", [_truncate, _delete, _flip_byte])
def test_the_quick_check_reads_no_file_and_leaves_the_checksums_to_the_reads(
    make_store: StoreFactory, damage: Callable[[CheckpointStore, str], str]
) -> None:
    """``latest_valid(content=False)``, a resume's plan: a missing or cut file is caught from the
    listing; a flipped byte only by the read that meets it, which names it, and nothing the
    quick check did makes that read trust the file."""
    store = make_store()
    _commit_small(store, 1)
    _commit_small(store, 2)
    fault = damage(store, f"{store._path(2)}/blob.bin")
    fresh = CheckpointStore(store.root, storage_options=store.storage_options)
    newest = fresh.latest_valid(content=False)
    if fault.startswith("checksum"):
        assert newest == 2
        with pytest.raises(CheckpointCorruptError, match=f"step-00000002/blob.bin: {fault}"):
            fresh.read_bytes(2, "blob.bin")
    else:
        assert newest == 1
    assert fresh.latest_valid(content=False, below=2) == 1 and fresh.latest_valid(below=1) is None


def test_garbled_manifest_is_named(make_store: StoreFactory, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store()
    _commit_small(store, 1)
    _commit_small(store, 2)
    store.fs.pipe_file(f"{store._path(2)}/manifest.json", b'{"format": 1, "files": {')
    problems = store.verify(2)
    assert problems == [
        f"{store.step_uri(2)}/manifest.json: bad manifest json (" + problems[0].split("(", 1)[1]
    ]
    with caplog.at_level(logging.WARNING, logger="rl_train.storage.checkpoint"):
        assert store.latest_valid() == 1
    assert "step-00000002/manifest.json: bad manifest json" in caplog.text
    fresh = CheckpointStore(store.root, storage_options=store.storage_options)
    with pytest.raises(CheckpointCorruptError, match="bad manifest json"):
        fresh.manifest(2)


def test_damaged_tensor_file_is_caught_on_read(make_store: StoreFactory) -> None:
    store = make_store()
    entry = store.write_tensors(1, "w.safetensors", {"w": torch.arange(1000, dtype=torch.float32)})
    store.commit(1, [entry], {})
    path = f"{store._path(1)}/w.safetensors"
    data = bytearray(store.fs.cat_file(path))
    data[-1] ^= 0x40
    store.fs.pipe_file(path, bytes(data))
    with pytest.raises(CheckpointCorruptError, match="step-00000001/w.safetensors: checksum crc32"):
        store.read_tensors(1, "w.safetensors")


def test_retention_keeps_the_last_n_and_every_mth(make_store: StoreFactory) -> None:
    store = make_store(keep_last=2, keep_every=5)
    for step in range(1, 13):
        store.commit(step, [store.write_bytes(step, "x.bin", b"x")], {})
    assert store.complete_steps() == [5, 10, 11, 12]
    assert store.latest_valid() == 12


def test_select_pruned_steps() -> None:
    # keep_last=2 keeps 11, 12; keep_every=5 keeps 5, 10; torn 3 < 12 goes, torn 13 > 12 stays.
    committed = [1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert select_pruned_steps(committed, [3, 13], 2, 5) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert select_pruned_steps([], [1, 2], 1, 0) == []  # nothing committed: no torn folder is older


def test_prune_never_deletes_a_torn_folder_newer_than_the_newest_commit(make_store: StoreFactory) -> None:
    store = make_store(keep_last=1)
    _commit_small(store, 1)
    store.write_bytes(2, "x.bin", b"torn, older")
    store.write_bytes(5, "x.bin", b"being written")
    _commit_small(store, 3)  # commit prunes: 1 (retention) and the torn 2, never 5
    assert store.complete_steps() == [3]
    assert not store.fs.exists(store.step_uri(1)) and not store.fs.exists(store.step_uri(2))
    assert store.fs.exists(f"{store.step_uri(5)}/x.bin")
    assert store.prune() == []


def test_other_folders_are_not_the_stores(make_store: StoreFactory) -> None:
    store = make_store(keep_last=1)
    for folder in ("eval", "step-123"):  # not named step-<8 digits>
        store.fs.makedirs(f"{store.root}/{folder}", exist_ok=True)
        store.fs.pipe_file(f"{store.root}/{folder}/manifest.json", b"{}")
    _commit_small(store, 1)
    _commit_small(store, 2)
    assert store.complete_steps() == [2]
    assert store.fs.exists(f"{store.root}/eval/manifest.json")
    assert store.fs.exists(f"{store.root}/step-123/manifest.json")


def test_a_committed_step_is_immutable_and_a_torn_one_can_be_redone(make_store: StoreFactory) -> None:
    store = make_store()
    store.write_bytes(1, "x.bin", b"first attempt, killed")
    entry = store.write_bytes(1, "x.bin", b"redone")
    store.commit(1, [entry], {})
    assert store.read_bytes(1, "x.bin") == b"redone"
    with pytest.raises(CheckpointError, match="step-00000001 is committed"):
        store.write_bytes(1, "y.bin", b"late")
    with pytest.raises(CheckpointError, match="already committed"):
        store.commit(1, [entry], {})


def test_commit_refuses_a_part_that_is_not_there(make_store: StoreFactory) -> None:
    store = make_store()
    entry = store.write_bytes(1, "x.bin", b"12345")
    ghost = PartEntry(path="y.bin", size=3, checksum="0" * 8)
    wrong = PartEntry(path="x.bin", size=9, checksum=entry.checksum)
    with pytest.raises(CheckpointError, match=r"y.bin is missing; x.bin is 5 bytes, not 9"):
        store.commit(1, [ghost, wrong], {})
    assert store.complete_steps() == []


def test_a_failed_write_leaves_nothing_under_the_name(make_store: StoreFactory) -> None:
    store = make_store()
    store.write_bytes(1, "keep.bin", b"k")
    tensors = {"a": torch.ones(1 << 18, dtype=torch.float64), "b": torch.empty(4, device="meta")}
    with pytest.raises(NotImplementedError):  # "a" is written, then "b" cannot be copied out
        store.write_tensors(1, "w.safetensors", tensors)
    assert store.fs.find(store.step_uri(1)) == [f"{store._path(1)}/keep.bin"]  # no temp, no half file


def test_download_dir_copies_a_prefix(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    parts = [
        store.write_json(1, "policy/config.json", {"model_type": "qwen2"}),
        store.write_tensors(1, "policy/model.safetensors", {"w": torch.randn(4, 4)}),
        store.write_bytes(1, "queue/records.parquet", b"not policy"),
    ]
    store.commit(1, parts, {})
    out = store.download_dir(1, "policy/", tmp_path / "dl")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == store.read_bytes(1, "policy/model.safetensors")
    with pytest.raises(CheckpointError, match="no files under 'critic'"):
        store.download_dir(1, "critic", tmp_path / "none")


def test_a_file_grown_after_commit_is_read_to_its_end_and_refused(make_store: StoreFactory, tmp_path: Path) -> None:
    """Reads buffer no more than the manifest's size; a longer file is still read to its end."""
    store = make_store()
    store.commit(1, [store.write_bytes(1, "policy/w.bin", b"abc" * 1000)], {})
    store.fs.pipe_file(f"{store._path(1)}/policy/w.bin", b"abc" * 1000 + b"more" * 5000)
    with pytest.raises(CheckpointCorruptError, match="policy/w.bin: size 23000 != 3000 in the manifest"):
        store.download_dir(1, "policy", tmp_path / "dl")
    assert store.verify(1) == [f"{store.step_uri(1)}/policy/w.bin: size 23000 != 3000 in the manifest"]


def _write_part_in_child(pickled_store: bytes, out: Any) -> None:
    store = pickle.loads(pickled_store)
    out.put(store.write_tensors(4, "actor/rank-1/model.safetensors", {"w": torch.arange(10.0)}))


def test_a_part_written_by_another_process_commits(make_store: StoreFactory) -> None:
    store = make_store()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_write_part_in_child, args=(pickle.dumps(store), queue))
    child.start()
    entry = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    store.commit(4, [entry, store.write_bytes(4, "driver.bin", b"d")], {})
    assert store.verify(4) == []
    assert torch.equal(store.read_tensors(4, "actor/rank-1/model.safetensors")["w"], torch.arange(10.0))


def test_empty_or_missing_root(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "nothing-yet"))
    assert store.complete_steps() == [] and store.latest_valid() is None and store.prune() == []


def test_s3_endpoint_from_the_environment(
    s3_root: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, options = s3_root
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["client_kwargs"]["endpoint_url"])
    store = CheckpointStore(root)
    store.commit(1, [store.write_bytes(1, "x.bin", b"via env")], {})
    assert CheckpointStore(root, storage_options=options).read_bytes(1, "x.bin") == b"via env"


def test_s3_without_s3fs_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rl-train\[s3\]'"):
        CheckpointStore("s3://bucket/run")


def test_background_writes_never_overlap() -> None:
    writer = BackgroundWriter()
    events: list[str] = []
    release, second_started = threading.Event(), threading.Event()

    def first() -> None:
        events.append("first:start")
        release.wait(timeout=30)
        events.append("first:end")

    def second() -> None:
        second_started.set()
        events.append("second:start")
        events.append("second:end")

    writer.submit(first)
    submitter = threading.Thread(target=writer.submit, args=(second,))
    submitter.start()
    # An overlapping writer would start the second write while the first is held open.
    assert not second_started.wait(timeout=0.5)
    release.set()
    submitter.join(timeout=30)
    writer.close()
    assert events == ["first:start", "first:end", "second:start", "second:end"]


def test_a_background_error_is_raised_by_the_next_wait_or_submit() -> None:
    writer = BackgroundWriter()

    def fail() -> None:
        raise OSError("disk full")

    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    writer.wait()  # raised once, then cleared

    ran: list[str] = []
    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writer.submit(lambda: ran.append("next"))
    assert ran == []  # the next write does not run over a failed one
    writer.submit(lambda: ran.append("after"))
    writer.close()
    assert ran == ["after"]


def test_a_damaged_tensor_header_is_refused_before_allocating(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    header = b'{"w":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4000000000000]}}'
    entry = store.write_bytes(1, "w.safetensors", len(header).to_bytes(8, "little") + header + b"\0" * 16)
    store.commit(1, [entry], {})
    with pytest.raises(CheckpointCorruptError, match="step-00000001/w.safetensors: bad tensor header"):
        store.read_tensors(1, "w.safetensors")


def test_a_format_1_manifest_with_sha256_still_reads_and_verifies(make_store: StoreFactory) -> None:
    """Checkpoints written before the switch to CRC-32 list SHA-256 digests (format 1)."""
    store = make_store()
    blob = bytes(range(256)) * 64
    entry = store.write_bytes(1, "blob.bin", blob)
    store.commit(1, [entry], {})
    manifest_path = f"{store._path(1)}/manifest.json"
    document = json.loads(store.fs.cat_file(manifest_path))
    document["format"] = 1
    document["files"]["blob.bin"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    store.fs.pipe_file(manifest_path, json.dumps(document).encode())
    fresh = CheckpointStore(store.root, storage_options=store.storage_options)
    assert fresh.verify(1) == [] and fresh.read_bytes(1, "blob.bin") == blob
    document["files"]["blob.bin"]["sha256"] = "0" * 64
    store.fs.pipe_file(manifest_path, json.dumps(document).encode())
    fresh = CheckpointStore(store.root, storage_options=store.storage_options)
    (problem,) = fresh.verify(1)
    assert "blob.bin: checksum sha256" in problem
