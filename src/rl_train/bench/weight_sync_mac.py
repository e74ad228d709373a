"""What authenticating weight sync costs: bucketed throughput with the bucket MAC against without.

Every bucket carries a tag that the sender computes and the receiver checks before a tensor
is handed out (``engines/weight_sync/auth.py``); over shared memory and Mooncake the receiver
also copies each bucket out of the shared buffer first. This bench runs, in one process pair
and interleaved, the same bucketed syncs three ways: ``none`` (no tag, no check, no copy: the
baseline), ``hmac-sha256`` (the tag as HMAC-SHA256, for comparison) and ``poly1305`` (what
the code uses), on the demo policy's weights and on a larger random model, over every
transport available here. Sender here, receiver in a spawned process, as in
``bench/weight_sync.py``. Target (issue 45): the MAC costs at most 5% of bucketed throughput.

    python -m rl_train.bench.weight_sync_mac --size-mb 256
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch

from rl_train.bench.weight_sync import CopyingEngine, available, make_weights, num_bytes
from rl_train.engines.weight_sync import auth
from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.boundaries import run_receiver, run_sender
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.errors import IntegrityError


class NoMac(auth.BucketMac):
    """The baseline: what a sync cost before buckets were tagged (no tag, no check, no copy)."""

    checks = False

    def tag(self, header: Sequence[int], records: list[Any], pieces: Sequence[torch.Tensor]) -> str:
        return ""

    def check(self, header: Sequence[int], records: list[Any], data: torch.Tensor, tag: str) -> None:
        return None


class HmacSha256Mac(auth.BucketMac):
    """The same one-time key, the bytes under HMAC-SHA256 instead of Poly1305."""

    def tag(self, header: Sequence[int], records: list[Any], pieces: Sequence[torch.Tensor]) -> str:
        mac = hmac.new(self._one_time_key(header, records), digestmod="sha256")
        for piece in pieces:
            if piece.numel():
                mac.update(auth.host_bytes(piece))
        return mac.hexdigest()

    def check(self, header: Sequence[int], records: list[Any], data: torch.Tensor, tag: str) -> None:
        if not hmac.compare_digest(self.tag(header, records, [data]), tag):
            raise IntegrityError("bucket failed its HMAC-SHA256 check")

    def check_into(
        self, header: Sequence[int], records: list[Any], source: torch.Tensor, target: torch.Tensor, tag: str
    ) -> None:
        target.copy_(source)
        self.check(header, records, target, tag)


MACS: dict[str, type[auth.BucketMac]] = {"none": NoMac, "hmac-sha256": HmacSha256Mac, "poly1305": auth.BucketMac}


@contextlib.contextmanager
def using(mac: str) -> Iterator[None]:
    """Ends built (sender) or attached (receiver, on its first sync) inside use ``mac``."""
    original = auth.BucketMac
    auth.BucketMac = MACS[mac]  # type: ignore[misc]
    try:
        yield
    finally:
        auth.BucketMac = original  # type: ignore[misc]


def serve(conn: Connection) -> None:
    torch.set_num_threads(1)
    receivers: dict[str, Any] = {}
    engine = CopyingEngine({})
    while True:
        command, *args = conn.recv()
        if command == "stop":
            return
        if command == "weights":
            engine = CopyingEngine({name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in args[0].items()})
            conn.send("ok")
        elif command == "open":
            key, fields, descriptor = args
            receivers[key] = build_weight_sync_backend(WeightSyncConfig(**fields)).build_receiver(descriptor)
            conn.send("ok")
        elif command == "sync":
            key, version, mac = args
            with using(mac):
                conn.send(run_receiver(engine, receivers[key], None, version, 300.0))
        elif command == "close":
            receivers.pop(args[0]).close()
            conn.send("ok")


class Session:
    def __init__(self, conn: Connection, transport: str, mac: str, bucket_mb: int) -> None:
        self.conn, self.mac, self.key = conn, mac, f"{transport}-{mac}"
        cfg = WeightSyncConfig(
            backend="bucketed", transport=transport, bucket_size_bytes=bucket_mb << 20, timeout_seconds=300.0
        )
        with using(mac):
            self.sender = build_weight_sync_backend(cfg).build_sender()
        conn.send(("open", self.key, cfg.model_dump(), self.sender.descriptor()))
        conn.recv()
        self.version = 0

    def sync(self, weights: dict[str, torch.Tensor]) -> float:
        self.version += 1
        start = time.perf_counter()
        self.conn.send(("sync", self.key, self.version, self.mac))
        run_sender(self.sender, lambda: iter(weights.items()), self.version)
        self.conn.recv()
        return time.perf_counter() - start

    def close(self) -> None:
        self.sender.close()
        self.conn.send(("close", self.key))
        self.conn.recv()


def demo_weights() -> dict[str, torch.Tensor]:
    from rl_train.bench.checkpoint import demo_state

    return {name: tensor.contiguous() for name, tensor in demo_state().weights.items()}


def measure(conn: Connection, label: str, weights: dict[str, torch.Tensor], args: argparse.Namespace) -> list[str]:
    """Lines of GB/s per transport and MAC, and each MAC's ratio to ``none``; interleaved runs."""
    conn.send(("weights", {name: (tuple(t.shape), t.dtype) for name, t in weights.items()}))
    conn.recv()
    total, lines = num_bytes(weights), []
    for transport in available(args.transports):
        sessions = [Session(conn, transport, mac, args.bucket_mb) for mac in MACS]
        best = {session.mac: float("inf") for session in sessions}
        for session in sessions:
            session.sync(weights)  # connect and warm up
        for _ in range(args.repeats):
            for session in sessions:
                best[session.mac] = min(best[session.mac], session.sync(weights))
        for session in sessions:
            session.close()
        for mac, seconds in best.items():
            ratio = best["none"] / seconds
            lines.append(f"{label:<10} {transport:<10} {mac:<12} {total / seconds / 1e9:7.2f} GB/s  {ratio:5.3f}x none")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256, help="MB of the larger model (default 256)")
    parser.add_argument("--bucket-mb", type=int, default=32, help="bucket_size_bytes in MiB (default 32)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each way; the best is reported")
    parser.add_argument("--transports", nargs="*", default=None, help="transports (default: all available)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    worker = context.Process(target=serve, args=(child,), daemon=True)
    worker.start()
    demo = demo_weights()
    lines = measure(conn, f"demo {num_bytes(demo) / 1e6:.1f}MB", demo, args)
    lines += measure(conn, f"{num_bytes(make_weights(args.size_mb)) / 1e6:.0f}MB", make_weights(args.size_mb), args)
    conn.send(("stop",))
    worker.join(10)
    print(f"buckets of {args.bucket_mb} MiB, best of {args.repeats} interleaved repeats")
    for line in lines:
        print(line)
    poly = [float(line.split()[-2].rstrip("x")) for line in lines if " poly1305 " in line]
    print(f"target poly1305 / none >= 0.95: worst {min(poly):.3f} ({'met' if min(poly) >= 0.95 else 'NOT met'})")


if __name__ == "__main__":
    main()
