"""The rollout side of the weight-sync tests, run in a separate (spawned) process.

One peer process hosts any number of receivers, each with its own tiny engine, and runs
``run_receiver`` for them on command from the test process over a pipe.
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import torch
from weight_sync_engine import SparseTinyRolloutEngine, TinyRolloutEngine

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.boundaries import run_receiver
from rl_train.engines.weight_sync.config import WeightSyncConfig

Packed = dict[str, tuple[str, tuple[int, ...], bytes]]


def pack_tensors(tensors: dict[str, torch.Tensor]) -> Packed:
    """Tensors as plain bytes: torch's own pickling would move each one through shared memory, slowly."""
    return {
        name: (str(t.dtype), tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        for name, t in tensors.items()
    }


def unpack_tensors(packed: Packed) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, (dtype, shape, data) in packed.items():
        raw = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data
            else torch.empty(0, dtype=torch.uint8)
        )
        tensors[name] = raw.view(getattr(torch, dtype.removeprefix("torch."))).reshape(shape)
    return tensors


def _send(conn: Connection, message: Any) -> None:
    """Plain pickle: the multiprocessing pickler would route every tensor through shared memory."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def serve(conn: Connection) -> None:
    torch.set_num_threads(1)
    receivers: dict[str, Any] = {}
    engines: dict[str, TinyRolloutEngine] = {}
    while True:
        command, key, *args = pickle.loads(conn.recv_bytes())
        try:
            if command == "stop":
                for receiver in receivers.values():
                    receiver.close()
                _send(conn, ("ok",))
                return
            if command == "open":
                cfg_fields, descriptor, weights, sparse_engine = args
                backend = build_weight_sync_backend(WeightSyncConfig(**cfg_fields))
                receivers[key] = backend.build_receiver(descriptor)
                engine_class = SparseTinyRolloutEngine if sparse_engine else TinyRolloutEngine
                engines[key] = engine_class(unpack_tensors(weights))
                _send(conn, ("ok",))
            elif command == "sync":
                version, payload, timeout_seconds = args
                engine = engines[key]
                metrics = run_receiver(engine, receivers[key], payload, version, timeout_seconds)
                _send(
                    conn, ("ok", metrics, pack_tensors(engine.weights()), engine.version, engine.events[-5:])
                )
            elif command == "fail_next":
                engines[key].fail_after_tensors = args[0]
                _send(conn, ("ok",))
            elif command == "sync_many":  # several replicas of one sender receive at once
                version, timeout_seconds = args
                keys = key.split(",")
                with ThreadPoolExecutor(len(keys)) as pool:
                    futures = [
                        pool.submit(run_receiver, engines[k], receivers[k], None, version, timeout_seconds)
                        for k in keys
                    ]
                    for future in futures:
                        future.result()
                _send(conn, ("ok", [pack_tensors(engines[k].weights()) for k in keys]))
        except Exception as exc:  # reported to the test process, which asserts on it
            _send(conn, ("error", type(exc).__name__, str(exc)))


class Peer:
    """Handle on one spawned peer process."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child,), daemon=True)
        self.process.start()

    def request(self, *message: Any) -> None:
        _send(self.conn, message)

    def reply(self, timeout_seconds: float = 60.0) -> tuple[Any, ...]:
        if not self.conn.poll(timeout_seconds):
            raise TimeoutError(f"peer process gave no reply within {timeout_seconds} s")
        return pickle.loads(self.conn.recv_bytes())

    def call(self, *message: Any) -> tuple[Any, ...]:
        self.request(*message)
        return self.reply()

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.request("stop", "")
                self.reply(5)
            except (TimeoutError, OSError, EOFError):
                pass
        self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
