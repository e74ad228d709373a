"""Checkpoint write and read MB/s against a raw Arrow file of the same bytes, locally and on S3.

Builds a training state: by default the demo's (the tiny policy's weights and an AdamW state
after one step), or ``--mb`` of random tensors (bf16 weights and their fp32 Adam moments).
Each round writes it through ``CheckpointStore`` (``write_tensors`` for the weights,
``write_state`` for the optimizer, ``write_table`` for a table of fake TransferQueue records,
then ``commit``, which prunes) and reads it back (``read_*``, each checking its file's size and
checksum against the manifest); then writes the same bytes as one Arrow IPC file through
fsspec, with no manifest, no checksum and no fsync, and reads that back. On local disk each
round also writes the checkpoint with ``os.fsync`` and the early writeback made no-ops (into a
root of its own): a commit fsyncs the parts' data and folders before it renames the manifest
into place, and the ``write-nofsync`` row against the ``write`` row is what that durability
costs (target: the store's write throughput at least 0.9 of its throughput without fsync). Store and raw rounds
alternate, so that drift on a busy machine favours neither; the best of ``--repeats`` rounds
is reported, and the store/raw ratio of each (target: at least 0.7). ``verify`` is
``latest_valid``'s pass over every checksum, reported on its own; ``load`` is what a resume
does, on a store instance of its own with an empty listing cache: the quick check
(``latest_valid(content=False)``: manifest, presence and sizes from one listing) and then
every read, each checking its checksum, against the raw read. Reads
follow the writes, so on local disk both sides read from the page cache. On S3 each row also
gives the requests of one operation, store/raw: a small checkpoint costs requests, not bytes.

    python -m rl_train.bench.checkpoint                 # the demo state, local disk
    python -m rl_train.bench.checkpoint --mb 200 --s3   # 200 MB, local disk and S3
    python -m rl_train.bench.checkpoint --s3 --s3-endpoint http://127.0.0.1:9000
    python -m rl_train.bench.checkpoint --resume [--prefect]   # + start-up to the first resumed step

``--resume`` times ``rl-train train`` on the demo config from process start to its first step,
fresh and resumed from a checkpoint (``rl_train.bench.startup --resume``: a run trained one step
beforehand, then one more step per timed run on the same command), medians of
``--resume-runs``, interleaved. ``--prefect`` adds both through Prefect, against a Prefect API
server started beforehand, as a served run and its retries have one (target: a resume within
10 s at the demo size).

``--s3`` without an endpoint (and without ``AWS_ENDPOINT_URL``) starts moto's S3 server in a
subprocess on 127.0.0.1 (its own process: in this one it would share the GIL with the writer).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rl_train.bench.s3_requests import count_s3_requests
from rl_train.storage import checkpoint_io
from rl_train.storage.checkpoint import CheckpointStore
from rl_train.storage.checkpoint_io import new_checksum
from rl_train.storage.checkpoint_manifest import CHECKSUM

TENSOR_BYTES = 4 << 20


@dataclass
class BenchState:
    """What one checkpoint of the bench holds."""

    label: str
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    records: pa.Table


def demo_state() -> BenchState:
    """The tiny demo policy's weights and an AdamW state after one step on a fake loss."""
    from rl_train.engines.model.loading import load_policy
    from rl_train.engines.model.tiny import create_tiny_policy

    with tempfile.TemporaryDirectory(prefix="rlt-ckpt-bench-") as folder:
        model, _ = load_policy(create_tiny_policy(Path(folder) / "policy", seed=0, pretrain_steps=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, model.config.vocab_size, (4, 32))).logits.float().pow(2).mean().backward()
    optimizer.step()
    weights = {name: p.detach() for name, p in model.state_dict().items()}
    return BenchState("demo (tiny policy + AdamW)", weights, optimizer.state_dict(), fake_records(512))


def random_state(size_mb: int) -> BenchState:
    """About ``size_mb``: bf16 weight matrices, a fifth of the bytes, and two fp32 Adam moments each."""
    generator = torch.Generator().manual_seed(0)
    weights: dict[str, torch.Tensor] = {}
    moments: dict[int, dict[str, torch.Tensor]] = {}
    total = 0
    while total < size_mb << 20:
        index = len(weights)
        weight = torch.randn(512, TENSOR_BYTES // 4096, generator=generator)
        weights[f"model.layers.{index}.mlp.weight"] = weight.to(torch.bfloat16)
        moments[index] = {"step": torch.tensor(1.0), "exp_avg": weight.clone(), "exp_avg_sq": weight.square()}
        total += weight.numel() * (2 + 4 + 4)
    optimizer = {
        "state": moments,
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": list(moments)}],
    }
    return BenchState(f"{size_mb} MB of random tensors", weights, optimizer, fake_records(2048))


def fake_records(num_records: int) -> pa.Table:
    """TransferQueue-like records: token ids, per-token log-probs, a reward and tags."""
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 32000, (num_records, 64), generator=generator)
    responses = torch.randint(0, 32000, (num_records, 128), generator=generator)
    log_probs = -torch.rand(num_records, 128, generator=generator)
    return pa.table(
        {
            "uid": [f"p{i // 8}-{i % 8}" for i in range(num_records)],
            "prompt_ids": prompts.tolist(),
            "response_ids": responses.tolist(),
            "rollout_log_probs": log_probs.tolist(),
            "reward": torch.rand(num_records, generator=generator).tolist(),
            "status": ["pending" if i % 5 == 0 else "done" for i in range(num_records)],
        }
    )


def write_store(store: CheckpointStore, step: int, state: BenchState) -> int:
    """One checkpoint as the trainer writes it (parts at once, then the commit); the bytes written."""
    parts = store.write_concurrently(
        [
            partial(store.write_tensors, step, "actor/rank-0/model.safetensors", state.weights),
            partial(store.write_state, step, "actor/rank-0/optimizer", state.optimizer),
            partial(store.write_table, step, "queue/records.parquet", state.records),
        ]
    )
    store.commit(step, parts, {"bench": True})
    return sum(part.size for part in parts)


def read_store(store: CheckpointStore, step: int) -> None:
    store.read_tensors(step, "actor/rank-0/model.safetensors")
    store.read_state(step, "actor/rank-0/optimizer")
    store.read_table(step, "queue/records.parquet")


def load_store(root: str, options: dict[str, Any] | None) -> None:
    """What a resume does with the store: find the newest complete checkpoint (no file read),
    then read it, each read checking its file's checksum."""
    store = CheckpointStore(root, storage_options=options)
    store.fs.invalidate_cache()  # fsspec shares the instance: forget what the writer listed
    step = store.latest_valid(content=False)
    assert step is not None
    read_store(store, step)


def _raw_rows(state: BenchState) -> Iterator[tuple[str, Any]]:
    """(name, buffer) of every tensor's bytes and of the records' Parquet file: what the store writes."""
    optimizer = state.optimizer["state"]
    tensors = {**state.weights, **{f"{i}.{k}": v for i, group in optimizer.items() for k, v in group.items()}}
    for name, tensor in tensors.items():
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        yield name, pa.py_buffer(flat.numpy())
    sink = pa.BufferOutputStream()
    pq.write_table(state.records, sink)
    yield RECORDS_NAME, sink.getvalue()


RECORDS_NAME = "records.parquet"
RAW_SCHEMA = pa.schema([("name", pa.string()), ("data", pa.large_binary())])


def write_raw(fs: fsspec.AbstractFileSystem, path: str, state: BenchState) -> None:
    """The same bytes as one Arrow IPC file, one record batch per buffer (no whole-file copy)."""
    with fs.open(path, "wb") as handle, pa.ipc.new_file(handle, RAW_SCHEMA) as writer:
        for name, buffer in _raw_rows(state):
            data = pa.Array.from_buffers(
                pa.large_binary(), 1, [None, pa.py_buffer(_offsets(buffer.size)), buffer]
            )
            writer.write_batch(pa.record_batch([pa.array([name]), data], schema=RAW_SCHEMA))


def _offsets(size: int) -> bytes:
    return torch.tensor([0, size], dtype=torch.int64).numpy().tobytes()


def read_raw(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Read the file and decode the records' Parquet, as the store's read does (the tensors'
    bytes are left as they are: a tensor over an Arrow buffer costs nothing)."""
    with fs.open(path, "rb") as handle:
        table = pa.ipc.open_file(handle).read_all()
    records = table.column("data")[table.column("name").to_pylist().index(RECORDS_NAME)]
    pq.read_table(pa.BufferReader(records.as_buffer()))


OPERATIONS = ("store_write", "store_read", "load", "verify", "raw_write", "raw_read")


@contextlib.contextmanager
def fsync_skipped() -> Iterator[None]:
    """``os.fsync`` and the early writeback (``checkpoint_io.start_writeback``) do nothing for a
    while: the store's write as it was before it made its files durable."""
    real_fsync, real_writeback = os.fsync, checkpoint_io.start_writeback

    def skip(fd: Any) -> None:
        return None

    os.fsync = checkpoint_io.start_writeback = skip
    try:
        yield
    finally:
        os.fsync, checkpoint_io.start_writeback = real_fsync, real_writeback


def write_store_without_fsync(store: CheckpointStore, step: int, state: BenchState) -> int:
    with fsync_skipped():
        return write_store(store, step, state)


@dataclass
class Rates:
    mb: float
    store_write: float
    store_read: float
    load: float
    verify: float
    raw_write: float
    raw_read: float
    requests: dict[str, int]
    """S3 requests of each operation in the last round; empty on local disk."""
    store_write_no_fsync: float | None = None
    """The store's write with ``os.fsync`` a no-op (local disk only: S3 has nothing to fsync)."""


def measure_throughput(root: str, options: dict[str, Any] | None, state: BenchState, repeats: int) -> Rates:
    """Best-of-``repeats`` seconds of each operation, store and raw rounds alternating."""
    store = CheckpointStore(root, keep_last=2, storage_options=options)
    fs, base = fsspec.core.url_to_fs(root, **(options or {}))
    fs.makedirs(base, exist_ok=True)
    on_s3 = fsspec.core.split_protocol(root)[0] == "s3"
    best: dict[str, float] = {}
    requests: dict[str, int] = {}
    size = 0

    def timed(name: str, run: Callable[[], Any]) -> Any:
        with count_s3_requests(fs) if on_s3 else contextlib.nullcontext(None) as counts:
            start = time.perf_counter()
            result = run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
        if counts is not None:
            requests[name] = sum(counts.values())
        return result

    unsynced = None if on_s3 else CheckpointStore(f"{root}-no-fsync", keep_last=2)
    for step in range(1, repeats + 1):
        if unsynced is not None:
            timed("store_write_no_fsync", partial(write_store_without_fsync, unsynced, step, state))
        size = timed("store_write", partial(write_store, store, step, state))
        timed("store_read", partial(read_store, store, step))
        timed("load", partial(load_store, root, options))
        timed("verify", partial(store.verify, step))
        raw_path = f"{base}/raw-{step}.arrow"
        timed("raw_write", partial(write_raw, fs, raw_path, state))
        timed("raw_read", partial(read_raw, fs, raw_path))
        fs.rm(raw_path)
    mb = size / 1e6
    rate = {name: mb / best[name] for name in OPERATIONS}
    return Rates(
        mb=mb, store_write=rate["store_write"], store_read=rate["store_read"], load=rate["load"],
        verify=rate["verify"], raw_write=rate["raw_write"], raw_read=rate["raw_read"], requests=requests,
        store_write_no_fsync=mb / best["store_write_no_fsync"] if "store_write_no_fsync" in best else None,
    )  # fmt: skip


def print_rates(where: str, rates: Rates) -> None:
    def row(op: str, store: float, raw: float | None, note: str) -> None:
        against = f"{raw:>10.1f}{store / raw:>11.2f}" if raw else " " * 21
        print(f"{where:<7}{op:<14}{store:>12.1f}{against}  {note}".rstrip())

    requests = rates.requests

    def count(store_op: str, raw_op: str | None) -> str:
        if not requests:
            return ""
        return f"{requests[store_op]}/{requests[raw_op]}" if raw_op else f"{requests[store_op]}"

    row("write", rates.store_write, rates.raw_write, count("store_write", "raw_write"))
    if rates.store_write_no_fsync is not None:
        row("write-nofsync", rates.store_write_no_fsync, rates.raw_write, "")
        ratio = rates.store_write / rates.store_write_no_fsync
        print(f"fsync ({where}): the store's write runs at {ratio:.2f} of its throughput without fsync")
    row("read", rates.store_read, rates.raw_read, count("store_read", "raw_read"))
    row("load", rates.load, rates.raw_read, count("load", "raw_read"))
    row("verify", rates.verify, None, count("verify", None))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in a subprocess on 127.0.0.1, with dummy credentials; its endpoint."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not start on port {port}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def s3_location(endpoint: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh bucket on ``endpoint`` (or on a moto server started here): (root, storage options)."""
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL")
    with contextlib.ExitStack() as stack:
        if endpoint is None:
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
            endpoint = stack.enter_context(moto_server())
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        bucket = f"rl-train-bench-{uuid.uuid4().hex[:12]}"
        fs = fsspec.filesystem("s3", **options)
        fs.mkdir(bucket)
        try:
            yield f"s3://{bucket}/checkpoints", options
        finally:
            fs.rm(bucket, recursive=True)


def report_throughput(args: argparse.Namespace, state: BenchState) -> None:
    """The store/raw section: one table, a row pair per location."""
    print(
        f"{'where':<7}{'op':<14}{'store MB/s':>12}{'raw MB/s':>10}{'store/raw':>11}  S3 requests (store/raw)"
    )
    with tempfile.TemporaryDirectory(prefix="rlt-ckpt-bench-", dir=args.local_dir) as folder:
        local = measure_throughput(f"{folder}/checkpoints", None, state, args.repeats)
    print_rates("local", local)
    if args.s3:
        with s3_location(args.s3_endpoint) as (root, options):
            print_rates("s3", measure_throughput(root, options, state, args.repeats))
    print(f"checkpoint of {local.mb:.1f} MB: {state.label}; best of {args.repeats} rounds")
    print("load: the quick check, then every read, on a fresh store; verify: latest_valid's checksums alone")
    print(
        f"{CHECKSUM} alone on this machine now: {measure_checksum(state, args.repeats):.0f} MB/s (a write "
        f"checksums on a second core while it writes; where none is free, store ~ 1 / (1/raw + 1/{CHECKSUM}))"
    )


def measure_checksum(state: BenchState, repeats: int) -> float:
    """MB/s of checksumming the state's bytes, best of ``repeats``: the one cost the store adds."""
    buffers = [buffer for _, buffer in _raw_rows(state)]
    size = sum(buffer.size for buffer in buffers)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        digest = new_checksum(CHECKSUM)
        for buffer in buffers:
            digest.update(buffer)
        best = min(best, time.perf_counter() - start)
    return size / 1e6 / best


def measure_resume(prefect: bool, runs: int) -> None:
    """Seconds from process start to the first step of a fresh run and of a resumed one (the
    demo config; medians of ``runs``, interleaved: ``rl_train.bench.startup``)."""
    from rl_train.bench.startup import Variant, print_table, run_variants

    variants = [Variant("fresh (no prefect)", prefect=False), Variant("resume (no prefect)", prefect=False, resume=True)]
    if prefect:
        variants += [Variant("fresh (Prefect server)"), Variant("resume (Prefect server)", resume=True)]
    run_variants(variants, runs, prefect_server=True)
    print_table(variants, runs)
    for fresh, resumed in zip(variants[::2], variants[1::2], strict=True):
        seconds = resumed.median("first_step")
        print(
            f"{resumed.name}: first resumed step at {seconds:.1f} s from process start "
            f"(target 10 s: {'met' if seconds <= 10 else 'missed'}), resumed/fresh "
            f"{seconds / fresh.median('first_step'):.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=0, help="random tensors of this size (0: the demo state)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per location; the best is reported")
    parser.add_argument("--s3", action="store_true", help="also measure on S3")
    parser.add_argument("--s3-endpoint", default=None, help="an S3 endpoint (default: start moto's server)")
    parser.add_argument(
        "--local-dir", default=None, help="where the local checkpoints go (default: the temp dir)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="also time start-up to the first resumed step (demo config)"
    )
    parser.add_argument(
        "--prefect", action="store_true", help="time --resume through Prefect too (a server started beforehand)"
    )
    parser.add_argument("--resume-runs", type=int, default=3, help="runs per variant of --resume (medians)")
    args = parser.parse_args(argv)
    state = random_state(args.mb) if args.mb else demo_state()
    report_throughput(args, state)
    if args.resume:
        measure_resume(args.prefect, args.resume_runs)


if __name__ == "__main__":
    main()
