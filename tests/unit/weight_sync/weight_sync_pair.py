"""A sender in the test process wired to a receiver hosted by a peer process."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import torch
from weight_sync_helpers import BUCKET_SIZE_BYTES
from weight_sync_peers import Peer, pack_tensors, unpack_tensors

from rl_train.engines.weight_sync.backends import build_weight_sync_backend
from rl_train.engines.weight_sync.base import WeightSender
from rl_train.engines.weight_sync.boundaries import run_sender
from rl_train.engines.weight_sync.config import WeightSyncConfig


class SyncPair:
    def __init__(
        self,
        peer: Peer,
        backend: str,
        transport: str,
        weights: dict[str, torch.Tensor],
        sender_class: Callable[[WeightSyncConfig], WeightSender] | None = None,
        timeout_seconds: float = 20.0,
        sparse_engine: bool = False,
        **fields: Any,
    ) -> None:
        self.cfg = WeightSyncConfig(
            backend=backend,
            transport=transport,
            bucket_size_bytes=BUCKET_SIZE_BYTES,
            timeout_seconds=timeout_seconds,
            **fields,
        )
        self.backend = build_weight_sync_backend(self.cfg)
        self.sender = sender_class(self.cfg) if sender_class else self.backend.build_sender()
        self.peer = peer
        self.key = uuid.uuid4().hex
        reply = peer.call(
            "open",
            self.key,
            self.cfg.model_dump(),
            self.sender.descriptor(),
            pack_tensors(weights),
            sparse_engine,
        )
        assert reply == ("ok",), reply

    def sync(
        self, weights: dict[str, torch.Tensor], version: int
    ) -> tuple[dict[str, float], tuple[Any, ...]]:
        """One sync of ``weights`` as ``version``: (sender metrics, peer reply)."""
        timeout = self.cfg.timeout_seconds

        def export() -> Any:
            return iter(weights.items())

        if self.backend.handover:
            payload, metrics = run_sender(self.sender, export, version)
            return metrics, self._unpacked(self.peer.call("sync", self.key, version, payload, timeout))
        self.peer.request("sync", self.key, version, None, timeout)
        try:
            _, metrics = run_sender(self.sender, export, version)
        finally:
            reply = self.peer.reply(timeout + 10)
        return metrics, self._unpacked(reply)

    @staticmethod
    def _unpacked(reply: tuple[Any, ...]) -> tuple[Any, ...]:
        if reply[0] != "ok":
            return reply
        return (*reply[:2], unpack_tensors(reply[2]), *reply[3:])

    def close(self) -> None:
        self.sender.close()
