"""Sparse deltas as stream items: group changes by entry count, checksum, verify, apply.

A delta of one sync is a list of flushes. Each flush holds up to ``entries_per_flush``
changed (index, value) entries, possibly from several tensors, and ends with a checksum of
everything in it. Flushes are cut by entry count, never by bytes, so that every rank of a
sharded sender cuts at the same places and their collective sequences stay aligned (R-8.3).

Encoded as (name, tensor) items of the bucketed stream:
``"{flush}/{tensor name}/index"`` (int32/int64 flat positions), ``"{flush}/{tensor name}/values"``
and, closing the flush, ``"{flush}/#checksum"`` = int64 ``[crc32, num_entries]``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from rl_train.engines.weight_sync.errors import WireFormatError

CHECKSUM = "#checksum"


def write_entries(dest: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Overwrite the flat positions ``index`` of ``dest`` with ``values``, in place, on ``dest``'s device."""
    dest.view(-1).index_copy_(0, index.to(dest.device, torch.long), values.to(dest.device, dest.dtype))


@dataclass
class Flush:
    segments: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(tensor name, flat positions, values) in stream order."""
    checksum: int | None = None
    num_entries: int = 0


def checksum(segments: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> int:
    """CRC-32 over the names, positions and value bytes of a flush, in order."""
    crc = 0
    for name, index, values in segments:
        crc = zlib.crc32(name.encode(), crc)
        for part in (index, values):
            crc = zlib.crc32(part.contiguous().view(torch.uint8).numpy().data, crc)
    return crc


def encode_flushes(
    changes: Iterable[tuple[str, torch.Tensor, torch.Tensor]], entries_per_flush: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Cut (name, positions, values) changes into flushes of ``entries_per_flush`` entries."""
    number, room, flush = 0, entries_per_flush, Flush()
    for name, index, values in changes:
        start = 0
        while start < index.numel():
            take = min(room, index.numel() - start)
            segment = (name, index[start : start + take], values[start : start + take])
            flush.segments.append(segment)
            yield f"{number}/{name}/index", segment[1]
            yield f"{number}/{name}/values", segment[2]
            start += take
            room -= take
            if room == 0:
                yield _close(number, flush, entries_per_flush)
                number, room, flush = number + 1, entries_per_flush, Flush()
    if flush.segments:
        yield _close(number, flush, entries_per_flush - room)


def _close(number: int, flush: Flush, num_entries: int) -> tuple[str, torch.Tensor]:
    return f"{number}/{CHECKSUM}", torch.tensor([checksum(flush.segments), num_entries], dtype=torch.int64)


def decode_flushes(items: Iterable[tuple[str, torch.Tensor]]) -> list[Flush]:
    """The flushes of a delta stream; an item that does not follow the encoding raises ``WireFormatError``."""
    flushes: dict[int, Flush] = {}
    pending_index: torch.Tensor | None = None
    for item, tensor in items:
        number_text, _, rest = item.partition("/")
        if not (number_text.isascii() and number_text.isdigit()):
            raise WireFormatError(f"delta item {item!r:.200} does not start with a flush number")
        flush = flushes.setdefault(int(number_text), Flush())
        if rest == CHECKSUM:
            if tensor.dtype != torch.int64 or tensor.shape != (2,):
                raise WireFormatError(f"delta item {item!r:.200} is not an int64 [crc32, num_entries]")
            flush.checksum, flush.num_entries = int(tensor[0]), int(tensor[1])
            continue
        name, _, part = rest.rpartition("/")
        if part == "index" and pending_index is None:
            pending_index = tensor.clone()  # stream items are views of a bucket that gets reused
        elif part == "values" and pending_index is not None:
            flush.segments.append((name, pending_index, tensor.clone()))
            pending_index = None
        else:
            raise WireFormatError(f"delta item {item!r:.200} is out of order or of an unknown kind")
    return [flushes[number] for number in sorted(flushes)]


Layout = dict[str, tuple[torch.dtype, int]]
"""Name -> (dtype, number of elements) of every tensor of the last full sync."""


def verify_flushes(flushes: list[Flush], layout: Layout) -> str | None:
    """The first reason not to apply, or ``None``: checksums, counts, names, dtypes and bounds."""
    for number, flush in enumerate(flushes):
        if flush.checksum is None:
            return f"flush {number} has no checksum"
        if checksum(flush.segments) != flush.checksum:
            return f"checksum mismatch in flush {number}"
        if sum(index.numel() for _, index, _ in flush.segments) != flush.num_entries:
            return f"flush {number} should hold {flush.num_entries} entries"
        for name, index, values in flush.segments:
            dtype, numel = layout.get(name, (None, 0))
            if dtype != values.dtype or index.numel() != values.numel():
                return f"flush {number} does not match tensor {name!r} of the last full sync"
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= numel):
                return f"flush {number} has positions outside tensor {name!r}"
    return None


def segments(flushes: list[Flush]) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """Every (tensor name, flat positions, values) of verified flushes, in stream order."""
    for flush in flushes:
        yield from flush.segments


def apply_flushes(flushes: list[Flush], mirror: dict[str, torch.Tensor]) -> list[str]:
    """Write verified flushes into ``mirror`` in place; returns the changed tensor names in order."""
    changed: dict[str, None] = {}
    for name, index, values in segments(flushes):
        write_entries(mirror[name], index, values)
        changed[name] = None
    return list(changed)
