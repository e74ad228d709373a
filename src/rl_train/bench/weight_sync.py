"""Weight-sync throughput: every backend/transport against memcpy and raw Mooncake, delta vs full.

Sender in this process, receiver in a spawned process with an engine that loads into
preallocated weights as the built-in rollout engine does (whole tensors copied, delta
entries written in place). Prints GB/s of a full sync per backend and
transport beside a plain memcpy of the same bytes and a raw Mooncake TCP write of one
buffer of that size, then the bytes and time of a delta sync against a full one at 1% and
3% of entries changed. Targets (issue 5): bucketed shm >= 0.6x memcpy, bucketed mooncake
>= 0.8x raw mooncake, delta at 1% >= 10x fewer bytes and >= 5x faster than full.

    python -m rl_train.bench.weight_sync --size-mb 64
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.boundaries import run_receiver, run_sender, write_entries
from rl_train.engines.weight_sync.config import MooncakeConfig, WeightSyncConfig
from rl_train.engines.weight_sync.transports import TRANSPORTS, check_transport_available

TENSOR_BYTES = 4 << 20


def make_weights(size_mb: int) -> dict[str, torch.Tensor]:
    """About ``size_mb`` of bf16 matrices (4 MiB each) plus fp32 norms, like a decoder's layers."""
    weights, total, layer = {}, 0, 0
    while total < size_mb << 20:
        weights[f"model.layers.{layer}.mlp.weight"] = torch.randn(1024, TENSOR_BYTES // 2048).to(
            torch.bfloat16
        )
        weights[f"model.layers.{layer}.norm.weight"] = torch.randn(2048)
        total += TENSOR_BYTES + 8192
        layer += 1
    return weights


def num_bytes(weights: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


def change_fraction(weights: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    changed = {}
    for name, tensor in weights.items():
        new = tensor.clone()
        index = torch.randint(tensor.numel(), (max(1, int(tensor.numel() * fraction)),), generator=generator)
        new.view(-1)[index] += 1.0
        changed[name] = new
    return changed


class CopyingEngine:
    """Loads received tensors into preallocated weights; the rest of the lifecycle is free."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights = {name: torch.empty_like(t) for name, t in weights.items()}

    def abort(self) -> int:
        return 0

    def release_kv_cache(self) -> None: ...

    def update_weights(self, named_tensors: Any, version: int) -> None:
        for name, tensor in named_tensors:
            self.weights[name].copy_(tensor)

    def update_weights_sparse(self, updates: Any, version: int) -> None:
        """As the built-in torch engine does: write the changed entries in place."""
        for name, index, values in updates:
            write_entries(self.weights[name], index, values)

    def reset_prefix_cache(self) -> None: ...

    def resume_kv_cache(self) -> None: ...


def serve(conn: Connection, size_mb: int) -> None:
    torch.set_num_threads(1)
    engine = CopyingEngine(make_weights(size_mb))
    receivers: dict[str, Any] = {}
    while True:
        command, *args = conn.recv()
        if command == "stop":
            return
        if command == "open":
            key, fields, descriptor = args
            receivers[key] = build_weight_sync_backend(WeightSyncConfig(**fields)).build_receiver(descriptor)
            conn.send("ok")
        elif command == "sync":
            key, version = args
            conn.send(run_receiver(engine, receivers[key], None, version, 300.0))
        elif command == "raw_mooncake":
            _serve_raw_mooncake(conn, args[0], MooncakeConfig.model_validate(args[1]))


def _serve_raw_mooncake(conn: Connection, nbytes: int, settings: MooncakeConfig) -> None:
    from rl_train.engines.weight_sync.transports.mooncake import start_engine

    engine = start_engine("127.0.0.1", **settings.model_dump(exclude={"direct"}))  # the transport's protocol and devices
    buffer = torch.zeros(nbytes, dtype=torch.uint8)
    engine.register_memory(buffer.data_ptr(), nbytes)
    conn.send((f"127.0.0.1:{engine.get_rpc_port()}", buffer.data_ptr()))
    conn.recv()  # the sender is done
    engine.unregister_memory(buffer.data_ptr())
    conn.send("ok")


def best_seconds(run: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_memcpy(weights: dict[str, torch.Tensor], repeats: int) -> float:
    destination = {name: torch.empty_like(t) for name, t in weights.items()}

    def copy() -> None:
        for name, tensor in weights.items():
            destination[name].copy_(tensor)

    copy()  # touch the destination pages once
    return best_seconds(copy, repeats)


def measure_raw_mooncake(conn: Connection, nbytes: int, repeats: int, settings: MooncakeConfig) -> float:
    from rl_train.engines.weight_sync.transports.mooncake import start_engine

    engine = start_engine("127.0.0.1", **settings.model_dump(exclude={"direct"}))
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    engine.register_memory(source.data_ptr(), nbytes)
    conn.send(("raw_mooncake", nbytes, settings.model_dump()))
    session, address = conn.recv()

    def write() -> None:
        if engine.transfer_sync_write(session, source.data_ptr(), address, nbytes) != 0:
            raise RuntimeError("raw Mooncake write failed")

    write()  # handshake and connection set-up are not part of the rate
    seconds = best_seconds(write, repeats)
    conn.send("done")
    conn.recv()
    engine.unregister_memory(source.data_ptr())
    return seconds


class Session:
    """One sender here, its receiver in the worker process."""

    def __init__(self, conn: Connection, backend: str, transport: str, args: argparse.Namespace) -> None:
        self.conn = conn
        cfg = WeightSyncConfig(
            backend=backend,
            transport=transport,
            bucket_size_bytes=args.bucket_mb << 20,
            delta_threads=args.delta_threads,
            timeout_seconds=300.0,
            mooncake=mooncake_settings(args) if transport == "mooncake" else MooncakeConfig(),
        )
        self.sender = build_weight_sync_backend(cfg).build_sender()
        self.key = f"{backend}-{transport}"
        conn.send(("open", self.key, cfg.model_dump(), self.sender.descriptor()))
        conn.recv()
        self.version = 0

    def sync(self, weights: dict[str, torch.Tensor]) -> tuple[float, float]:
        """(seconds, bytes moved) of one sync, from export to the receiver's engine holding it."""
        self.version += 1
        start = time.perf_counter()
        self.conn.send(("sync", self.key, self.version))
        _, metrics = run_sender(self.sender, lambda: iter(weights.items()), self.version)
        self.conn.recv()
        return time.perf_counter() - start, metrics["weight_sync/bytes"]

    def best(self, weights: dict[str, torch.Tensor], repeats: int) -> float:
        return min(self.sync(weights)[0] for _ in range(repeats))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=64, help="MB of weights to sync (default 64)")
    parser.add_argument("--bucket-mb", type=int, default=32, help="bucket_size_bytes in MiB (default 32)")
    parser.add_argument(
        "--delta-threads", type=int, default=2, help="delta_threads of the delta sender (default 2)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best is reported")
    parser.add_argument(
        "--transports", nargs="*", default=None, help="transports to run (default: all available here)"
    )
    parser.add_argument(
        "--mooncake-protocol", choices=["tcp", "rdma"], default="tcp", help="the mooncake transport's protocol"
    )
    parser.add_argument(
        "--mooncake-direct",
        action="store_true",
        help="write big chunks from the exported tensors (rollout.weight_sync.mooncake.direct); off: packed, the default",
    )
    parser.add_argument(
        "--mooncake-devices", default="auto", help="rdma: device names, comma-separated, or auto (default)"
    )
    return parser.parse_args(argv)


def mooncake_settings(args: argparse.Namespace) -> MooncakeConfig:
    """``rollout.weight_sync.mooncake`` for the bench: the raw engine and the transport share it."""
    if args.mooncake_protocol == "tcp":
        return MooncakeConfig(direct=args.mooncake_direct)
    return MooncakeConfig(protocol="rdma", devices=args.mooncake_devices, direct=args.mooncake_direct)


def available(transports: list[str] | None) -> list[str]:
    names = []
    for name in transports or TRANSPORTS.names():
        try:
            check_transport_available(name)
        except ValueError as exc:
            print(f"skip {name}: {exc}")
            continue
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    weights = make_weights(args.size_mb)
    total = num_bytes(weights)
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    worker = context.Process(target=serve, args=(child, args.size_mb), daemon=True)
    worker.start()
    transports = available(args.transports)
    gbps = {"memcpy": total / measure_memcpy(weights, args.repeats) / 1e9}
    raw_seconds = []
    if "mooncake" in transports:  # measured before and after the backends; the faster one counts
        raw_seconds.append(measure_raw_mooncake(conn, total, args.repeats, mooncake_settings(args)))
        print(f"mooncake over {args.mooncake_protocol}")
    print(f"{total / 1e6:.0f} MB in {len(weights)} tensors, buckets of {args.bucket_mb} MiB")
    full_seconds: dict[str, float] = {}
    for transport in transports:
        session = Session(conn, "bucketed", transport, args)
        session.sync(weights)  # connect and warm up
        full_seconds[transport] = session.best(weights, args.repeats)
        gbps[f"bucketed {transport}"] = total / full_seconds[transport] / 1e9
        session.sender.close()
    if raw_seconds:
        raw_seconds.append(measure_raw_mooncake(conn, total, args.repeats, mooncake_settings(args)))
        gbps["raw mooncake"] = total / min(raw_seconds) / 1e9
    for name, rate in gbps.items():
        line = f"{name:<22} {rate:7.2f} GB/s  {rate / gbps['memcpy']:5.2f}x memcpy"
        if "mooncake" in name and "raw mooncake" in gbps:
            line += f"  {rate / gbps['raw mooncake']:5.2f}x raw mooncake"
        print(line)
    delta = {t: report_delta(conn, t, weights, full_seconds[t], total, args) for t in transports}
    conn.send(("stop",))
    worker.join(10)
    print_targets(gbps, delta)


def print_targets(gbps: dict[str, float], delta: dict[str, tuple[float, float]]) -> None:
    """The issue's targets, each with the measured ratio."""
    checks = []
    if "bucketed shm" in gbps:
        checks.append(("bucketed shm / memcpy", gbps["bucketed shm"] / gbps["memcpy"], 0.6))
    if "bucketed mooncake" in gbps:
        checks.append(
            ("bucketed mooncake / raw mooncake", gbps["bucketed mooncake"] / gbps["raw mooncake"], 0.8)
        )
    for transport, (fewer_bytes, faster) in delta.items():
        checks.append((f"delta 1% over {transport}: fewer bytes", fewer_bytes, 10.0))
        checks.append((f"delta 1% over {transport}: faster than full", faster, 5.0))
    for name, ratio, target in checks:
        print(f"target {name:<44} {ratio:6.2f}  (>= {target:g})  {'met' if ratio >= target else 'NOT met'}")


def report_delta(
    conn: Connection,
    transport: str,
    weights: dict[str, torch.Tensor],
    full_seconds: float,
    total: int,
    args: argparse.Namespace,
) -> tuple[float, float]:
    """Prints delta against full at 1% and 3% changed; returns (fewer-bytes, speed-up) at 1%."""
    session = Session(conn, "delta", transport, args)
    session.sync(weights)  # the full seed
    current, ratios = weights, []
    for fraction in (0.01, 0.03):
        runs = []
        for repeat in range(args.repeats):
            current = change_fraction(current, fraction, seed=repeat)
            runs.append(session.sync(current))
        seconds, moved = min(runs)
        print(
            f"delta {transport:<10} {fraction:4.0%} changed: {moved / 1e6:7.1f} MB in {seconds * 1e3:7.1f} ms"
            f" | full {total / 1e6:7.1f} MB in {full_seconds * 1e3:7.1f} ms"
            f" | {total / moved:5.1f}x fewer bytes, {full_seconds / seconds:5.1f}x faster"
        )
        ratios.append((total / moved, full_seconds / seconds))
    session.sender.close()
    return ratios[0]


if __name__ == "__main__":
    main()
