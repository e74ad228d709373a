"""The checkpoint bench compares like with like: the raw file holds the bytes the store writes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_train.bench.checkpoint import (
    RECORDS_NAME,
    main,
    measure_throughput,
    random_state,
    read_raw,
    write_raw,
    write_store,
)
from rl_train.storage.checkpoint import CheckpointStore


def test_the_raw_file_holds_the_bytes_the_store_writes(tmp_path: Path) -> None:
    state = random_state(1)
    fs = fsspec.filesystem("file")
    write_raw(fs, str(tmp_path / "raw.arrow"), state)
    read_raw(fs, str(tmp_path / "raw.arrow"))
    table = pa.ipc.open_file(pa.OSFile(str(tmp_path / "raw.arrow"))).read_all()
    sizes = dict(
        zip(table.column("name").to_pylist(), (len(b.as_py()) for b in table.column("data")), strict=True)
    )
    records = table.column("data")[table.column("name").to_pylist().index(RECORDS_NAME)].as_py()
    assert pq.read_table(io.BytesIO(records)).equals(state.records)

    store = CheckpointStore(str(tmp_path / "ckpt"))
    write_store(store, 1, state)
    files = store.manifest(1)["files"]
    tensor_bytes = sum(size for name, size in sizes.items() if name != RECORDS_NAME)
    stored_tensor_files = (
        files["actor/rank-0/model.safetensors"]["size"] + files["actor/rank-0/optimizer.safetensors"]["size"]
    )
    headers = stored_tensor_files - tensor_bytes
    assert 0 < headers < 64 << 10  # the same tensor bytes, plus two safetensors headers
    assert files["queue/records.parquet"]["size"] == sizes[RECORDS_NAME]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_measure_throughput_runs_on_both(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    root: str
    options: dict[str, Any] | None
    root, options = (str(tmp_path / "ckpt"), None) if where == "local" else request.getfixturevalue("s3_root")
    rates = measure_throughput(root, options, random_state(1), repeats=1)
    assert rates.mb > 1
    assert min(rates.store_write, rates.store_read, rates.load, rates.verify, rates.raw_write, rates.raw_read) > 0
    assert CheckpointStore(root, storage_options=options).complete_steps() == [1]
    if where == "s3":  # 3 parts, one "committed?" GET, one listing, the manifest; the raw file: one PUT
        assert rates.requests["store_write"] == 6 and rates.requests["raw_write"] == 1
    else:
        assert rates.requests == {}


def test_main_prints_store_and_raw_rates_locally_and_on_its_own_s3_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    main(["--mb", "1", "--repeats", "1", "--s3"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    ops = [(row[0], row[1]) for row in rows if row and row[0] in ("local", "s3")]
    local_ops = ("write", "write-nofsync", "read", "load", "verify")  # S3 has nothing to fsync
    assert ops == [("local", op) for op in local_ops] + [("s3", op) for op in ("write", "read", "load", "verify")]
    assert [row[:2] for row in rows if row and row[0] == "fsync"] == [["fsync", "(local):"]]
    for row in rows:
        if row and row[0] in ("local", "s3") and row[1] != "verify":
            store, raw, ratio = map(float, row[2:5])
            assert ratio == pytest.approx(store / raw, abs=0.01)
            assert len(row) == (6 if row[0] == "s3" else 5)  # S3 rows: requests, store/raw
    requests = {row[1]: row[-1] for row in rows if row and row[0] == "s3"}
    assert requests["write"] == "6/1" and int(requests["verify"]) == 5  # manifest, listing, 3 files
