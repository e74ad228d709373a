"""Fault injection for the weight-sync tests, kept out of the production senders."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.engines.weight_sync.delta import DeltaSender
from rl_train.engines.weight_sync.wire import Deadline


def flip_first_value(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream items with one bit of the first delta value flipped (on a copy)."""
    corrupted = False
    for name, tensor in items:
        if not corrupted and name.endswith("/values") and tensor.numel():
            tensor = tensor.clone()
            tensor.view(-1).view(torch.uint8)[0] ^= 0x10
            corrupted = True
        yield name, tensor


class CorruptingDeltaSender(DeltaSender):
    """Damages every delta between its checksum and the wire, as a bad link or a bad copy would.

    The delta items pass through the stream's ``send_stream`` after ``encode_flushes`` took
    their checksums; this sender wraps that call on its own stream, so full streams pass
    untouched and each delta arrives with one flipped bit.
    """

    def __init__(self, cfg: WeightSyncConfig) -> None:
        super().__init__(cfg)
        stream = self._stream
        send_stream = stream.send_stream

        def corrupting(
            header: dict[str, Any], items: Iterable[tuple[str, torch.Tensor]], deadline: Deadline
        ) -> int:
            return send_stream(header, flip_first_value(items) if header["kind"] == "delta" else items, deadline)

        stream.send_stream = corrupting  # type: ignore[method-assign]
