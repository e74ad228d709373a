"""Tensors as a safetensors file, streamed one tensor at a time in both directions.

The safetensors layout is simple: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range, then the raw bytes. ``safetensors.torch.save``
builds the whole file in memory first (a second copy of every weight), and its ``load`` needs
the whole file in memory (or a local path to map); a checkpoint on S3 has neither. Here each
tensor is written from its own memory and read straight into a freshly allocated tensor, so no
step holds two copies of the state. The files are ordinary safetensors files (tests check both
directions against the ``safetensors`` package); ``transformers`` loads them as they are.

Tensors are laid out by element size, largest first, and the header is padded to 8 bytes, so
every tensor starts at a multiple of its element size, as the reference writer does.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Callable
from typing import Any

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint64: "U64",
    torch.uint32: "U32",
    torch.uint16: "U16",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
"""The safetensors dtype name of each torch dtype a checkpoint may hold."""
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
STAGED_READ_BYTES = 8 << 20
"""Up to this much tensor data is read in one call and copied into the tensors: a read per
tensor costs more than the copy when there are hundreds of small ones."""
MAX_HEADER_BYTES = 100 << 20
"""A larger header is a damaged length field, not a real file (the reference reader's limit)."""


def _check_little_endian() -> None:
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this machine is not")


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as a contiguous CPU tensor: a view when it already is one."""
    return tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy (numpy has no bf16: view as u8)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data.cast("B")


def build_header(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None
) -> tuple[bytes, list[str]]:
    """The length-prefixed, padded header and the order in which the tensors' bytes follow."""
    for name, tensor in tensors.items():
        if tensor.dtype not in DTYPE_NAMES:
            raise TypeError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors name")
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata maps str to str")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        tensor = tensors[name]
        num_bytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + num_bytes],
        }
        offset += num_bytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def write_tensor_file(
    write: Callable[[Any], object], tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Stream ``tensors`` as a safetensors file through ``write``, one tensor in memory at a time."""
    _check_little_endian()
    header, order = build_header(tensors, metadata)
    write(header)
    for name in order:
        tensor = _plain(tensors[name])
        if tensor.numel():
            write(_bytes_of(tensor))


class TensorFileError(ValueError):
    """The bytes are not a well-formed safetensors file."""


def read_tensor_file(
    read_exact: Callable[[int], bytes],
    readinto_exact: Callable[[memoryview], None],
    file_bytes: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors (in file order) and metadata of a safetensors file, each read straight into
    its own storage. Not views of one buffer: some consumers read a tensor's storage from its
    start, ignoring the view's offset (``torch.set_rng_state`` then refuses the state or
    crashes). ``file_bytes``, when known, bounds what a damaged header may ask to allocate."""
    _check_little_endian()
    (header_bytes,) = struct.unpack("<Q", read_exact(8))
    if header_bytes > min(MAX_HEADER_BYTES, file_bytes if file_bytes is not None else MAX_HEADER_BYTES):
        raise TensorFileError(f"bad tensor header: length {header_bytes}")
    try:
        header = json.loads(read_exact(header_bytes))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TensorFileError(f"bad tensor header json ({error})") from None
    if not isinstance(header, dict):
        raise TensorFileError("bad tensor header: not an object")
    metadata = header.pop("__metadata__", None) or {}
    data_limit = None if file_bytes is None else file_bytes - 8 - header_bytes
    specs = sorted((_spec(name, entry) for name, entry in header.items()), key=lambda spec: spec[3])
    position = 0
    for name, dtype, shape, begin, end in specs:
        if begin != position or end - begin != math.prod(shape) * dtype.itemsize:
            raise TensorFileError(f"bad tensor header: tensor {name!r} at bytes {begin}..{end}")
        position = end
    if data_limit is not None and position != data_limit:
        raise TensorFileError(f"bad tensor header: {position} bytes of tensors in {data_limit} bytes of data")
    tensors = {name: torch.empty(shape, dtype=dtype) for name, dtype, shape, _, _ in specs}
    if position <= STAGED_READ_BYTES:  # many small tensors (an optimizer's): one read, then copies
        staging = memoryview(bytearray(position))
        readinto_exact(staging)
        for name, _, _, begin, end in specs:
            if end > begin:
                _bytes_of(tensors[name])[:] = staging[begin:end]
        return tensors, metadata
    for name, *_ in specs:
        if tensors[name].numel():
            readinto_exact(_bytes_of(tensors[name]))
    return tensors, metadata


def _spec(name: str, entry: Any) -> tuple[str, torch.dtype, list[int], int, int]:
    """(name, dtype, shape, begin, end) of one header entry, checked for form."""
    if not isinstance(entry, dict):
        raise TensorFileError(f"bad tensor header: tensor {name!r} is not an object")
    name_of_dtype = entry.get("dtype")
    dtype = DTYPES.get(name_of_dtype) if isinstance(name_of_dtype, str) else None
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if dtype is None or not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise TensorFileError(
            f"bad tensor header: tensor {name!r} has dtype {entry.get('dtype')!r}, shape {shape!r}"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise TensorFileError(f"bad tensor header: tensor {name!r} has no data_offsets")
    return name, dtype, shape, offsets[0], offsets[1]
