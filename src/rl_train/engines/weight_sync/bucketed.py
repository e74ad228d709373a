"""``bucketed``: every sync streams the full weights in fixed-size buckets over a transport.

Bounded memory (two buckets per side) and packing overlapped with sending, over shared
memory, TCP, torch.distributed or Mooncake, chosen by ``rollout.weight_sync.transport``.
"""

from __future__ import annotations

from typing import Any

from rl_train.engines.node_address import node_ip
from rl_train.engines.weight_sync.base import NamedTensors
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.stream import StreamSender
from rl_train.engines.weight_sync.stream_receiver import StreamedTensors, StreamReceiver
from rl_train.engines.weight_sync.wire import Deadline


def build_stream_sender(cfg: WeightSyncConfig) -> StreamSender:
    host = cfg.host or node_ip()
    return StreamSender(cfg.transport, cfg.bucket_size_bytes, cfg.num_receivers, host, cfg.transport_options())


class BucketedSender:
    def __init__(self, cfg: WeightSyncConfig) -> None:
        self._timeout_seconds = cfg.timeout_seconds
        self._stream = build_stream_sender(cfg)
        self._metrics: dict[str, float] = {}

    def descriptor(self) -> dict[str, Any]:
        return self._stream.descriptor()

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        deadline = Deadline(self._timeout_seconds)
        num_bytes = self._stream.send_stream({"version": version, "kind": "full"}, named_tensors, deadline)
        self._stream.gather("done", deadline, f"to finish loading version {version}")
        self._metrics = {"weight_sync/bytes": float(num_bytes)}
        return None

    def sync_metrics(self) -> dict[str, float]:
        """What the last ``send`` moved; ``run_sender`` merges it into the step's metrics."""
        return dict(self._metrics)

    def close(self) -> None:
        self._stream.close()


class BucketedReceiver:
    def __init__(self, descriptor: dict[str, Any], timeout_seconds: float) -> None:
        self._stream = StreamReceiver(descriptor, timeout_seconds)

    def receive(self, payload: Any, timeout_seconds: float) -> tuple[NamedTensors, int]:
        deadline = Deadline(timeout_seconds)
        version = int(self._stream.begin(deadline)["version"])
        return StreamedTensors(self._stream, self._stream.tensors(deadline), version, deadline), version

    def close(self) -> None:
        self._stream.close()
