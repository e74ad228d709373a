"""Packing tensors into fixed-size byte buckets and rebuilding them bit for bit (R-8.2).

The sender flattens each tensor to its raw bytes and copies them into one of two
alternating buffers of ``bucket_size_bytes``; a tensor that fits a bucket is never cut (it
starts a fresh bucket if need be), a larger one is cut into chunks that continue in the
next buckets. A receiver hands whole tensors to the engine as views of the bucket, with no
copy of its own, and assembles only the chunked ones. Each bucket is described by ``ChunkMeta``
records that travel on the control channel ahead of (or beside) the bytes. Because
only two buffers exist, memory stays at about two buckets whatever the model size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass
from typing import Any

import torch

from rl_train.engines.weight_sync.errors import TransportError, WireFormatError
from rl_train.engines.weight_sync.frame import check_shape, dtype_from_name


@dataclass(frozen=True)
class ChunkMeta:
    """Where one piece of one tensor sits inside a bucket."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    tensor_nbytes: int
    chunk_offset: int
    """Byte offset of this chunk inside the flattened tensor."""
    buffer_offset: int
    """Byte offset of this chunk inside the bucket."""
    nbytes: int

    def to_wire(self) -> list[Any]:
        """The record as a JSON list, in field order, for the bucket announcement."""
        return [self.name, self.dtype, list(self.shape), *astuple(self)[3:]]

    @classmethod
    def from_wire(cls, fields: Any, bucket_nbytes: int) -> ChunkMeta:
        """A record read off the wire, checked to describe bytes inside a bucket of ``bucket_nbytes``."""
        if not isinstance(fields, list) or len(fields) != 7 or not isinstance(fields[0], str):
            raise WireFormatError(f"malformed chunk record {fields!r:.200}")
        name, dtype_text, shape, *numbers = fields
        what = f"chunk of tensor {name!r:.200}"
        if not all(type(n) is int and n >= 0 for n in numbers):
            raise WireFormatError(f"{what}: sizes and offsets must be non-negative integers, got {numbers!r}")
        dtype = dtype_from_name(dtype_text)
        tensor_nbytes, chunk_offset, buffer_offset, nbytes = numbers
        chunk = cls(name, dtype_text, check_shape(shape, dtype, tensor_nbytes, what), *numbers)
        if chunk_offset + nbytes > tensor_nbytes or buffer_offset + nbytes > bucket_nbytes:
            raise WireFormatError(f"{what}: bytes [{buffer_offset}, +{nbytes}) lie outside the tensor or bucket")
        if nbytes == tensor_nbytes and buffer_offset % dtype.itemsize:
            raise WireFormatError(f"{what}: a whole tensor must start aligned to its {dtype.itemsize}-byte element")
        return chunk


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``tensor`` as a flat uint8 view (a copy only when not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


ALIGN_BYTES = 64
"""Each tensor starts at a multiple of this inside a bucket, so a receiver can view it in place."""

Acquire = Callable[[int], None]
"""Blocks until buffer ``index`` may be overwritten (its previous bucket was consumed)."""
Emit = Callable[[int, int, list[ChunkMeta]], None]
"""Hands a packed bucket on: (buffer index, bytes used, chunk records)."""
Direct = Callable[[int, int, torch.Tensor], bool]
"""Offers a chunk's bytes (buffer index, offset in the bucket, uint8 view of the tensor) to a
transport that can send them from where they lie; ``True``: taken, the packer copies nothing."""


def pack_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    buffers: list[torch.Tensor],
    acquire: Acquire,
    emit: Emit,
    direct: Direct | None = None,
) -> int:
    """Pack every tensor into the alternating ``buffers``; returns the number of buckets emitted.

    With ``direct``, each chunk is first offered to the transport; the bucket layout, and so
    what receivers see, is the same either way.
    """
    size = buffers[0].numel()
    index, used, end, num_buckets = 0, 0, 0, 0  # end: last data byte, before any alignment padding
    entries: list[ChunkMeta] = []
    acquire(index)
    for name, tensor in named_tensors:
        dtype_from_name(str(tensor.dtype))  # one the receivers accept, or fail here, naming it
        data = tensor_bytes(tensor)
        total, offset = data.numel(), 0
        used = min(-(-used // ALIGN_BYTES) * ALIGN_BYTES, size)
        if total <= size and total > size - used:
            used = size  # start a fresh bucket: a tensor that fits one is never cut
        while True:
            if used == size:
                emit(index, end, entries)
                num_buckets += 1
                index, used, end, entries = 1 - index, 0, 0, []
                acquire(index)
            count = min(total - offset, size - used)
            piece = data[offset : offset + count]
            if count and (direct is None or not direct(index, used, piece)):
                buffers[index][used : used + count].copy_(piece)
            entries.append(
                ChunkMeta(name, str(tensor.dtype), tuple(tensor.shape), total, offset, used, count)
            )
            used += count
            end = used
            offset += count
            if offset >= total:
                break
    if entries:
        emit(index, end, entries)
        num_buckets += 1
    return num_buckets


class TensorAssembler:
    """Receiver side: whole tensors as views of the bucket, chunked ones assembled into new tensors."""

    def __init__(self) -> None:
        self._pending: tuple[ChunkMeta, torch.Tensor, torch.Tensor] | None = None

    def add_bucket(
        self, bucket: torch.Tensor, entries: list[ChunkMeta]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield each tensor completed by this bucket.

        A tensor that lies whole in the bucket is a view of it: valid until the caller asks
        for the item after the bucket's last one (the bucket is then released for reuse).
        """
        for entry in entries:
            data = bucket[entry.buffer_offset : entry.buffer_offset + entry.nbytes]
            if entry.chunk_offset == 0 and entry.nbytes == entry.tensor_nbytes and self._pending is None:
                yield entry.name, data.view(dtype_from_name(entry.dtype)).reshape(entry.shape)
                continue
            if entry.chunk_offset == 0:
                self._start(entry)
            assert self._pending is not None
            first, tensor, flat = self._pending
            if first.name != entry.name or entry.chunk_offset + entry.nbytes > first.tensor_nbytes:
                raise TransportError(f"bucket metadata out of order at tensor {entry.name!r}")
            flat[entry.chunk_offset : entry.chunk_offset + entry.nbytes].copy_(data)
            if entry.chunk_offset + entry.nbytes == first.tensor_nbytes:
                self._pending = None
                yield entry.name, tensor

    def finish(self) -> None:
        if self._pending is not None:
            raise TransportError(f"stream ended inside tensor {self._pending[0].name!r}")

    def _start(self, entry: ChunkMeta) -> None:
        if self._pending is not None:
            raise TransportError(f"tensor {self._pending[0].name!r} ended early, before {entry.name!r}")
        tensor = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype))
        flat = tensor.reshape(-1).view(torch.uint8)
        if flat.numel() != entry.tensor_nbytes:
            raise TransportError(f"tensor {entry.name!r}: metadata says {entry.tensor_nbytes} bytes")
        self._pending = (entry, tensor, flat)
