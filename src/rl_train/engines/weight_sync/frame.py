"""The frame of the weight-sync control channel: a fixed header, JSON metadata, raw tensor bytes.

A peer that reaches the sender's port must not be able to run code in the trainer, so
nothing here unpickles: a frame is decoded by checking lengths, parsing JSON and viewing
bytes as tensors of an allowed dtype. Layout, in network byte order::

    header    magic b"RLWS" | format version (u8) | 3 reserved bytes
              | metadata length (u32) | payload length (u64)
    metadata  UTF-8 JSON: {"message": [kind, *fields], "tensors": [{"dtype", "shape", "nbytes"}, ...]}
    tag       32 bytes, only once the channel is sealed (after the handshake, ``auth.py``):
              HMAC-SHA256 of the frame's sequence number, header and metadata
    payload   each tensor's raw bytes, starting at a multiple of TENSOR_ALIGN_BYTES

A sealed frame's tag is checked before its metadata is parsed. A payload is never covered
by the frame's tag: the only payloads are bucket bytes, which their own tag covers (the
bucket announcement carries it).

Every declared length is checked against a cap before anything is allocated, every message
against the table of the stream protocol's messages (``MESSAGES``), every dtype against an
allow-list; whatever does not fit raises ``WireFormatError`` with the reason.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl_train.engines.weight_sync.errors import WireFormatError

MAGIC = b"RLWS"
FORMAT_VERSION = 2
"""2: the handshake is a challenge-response and sealed frames carry a tag (1 sent a bare token)."""
HEADER = struct.Struct("!4sB3xIQ")
TENSOR_ALIGN_BYTES = 16
"""Tensors start at multiples of this in the payload (the widest allowed element), so they are viewed in place."""
MAX_META_BYTES = 64 << 20
"""Cap on the JSON of one frame: a bucket announcement of a huge model fits, a forged length does not."""
MAX_DIMS = 64
"""Most dimensions a tensor may declare (torch's own limit)."""

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
        "complex64", "complex128", "int64", "int32", "int16", "int8", "uint8", "bool",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}  # fmt: skip
"""The dtypes a frame or a bucket may carry: plain numeric ones, whose every bit pattern is a value."""

MESSAGES: dict[str, tuple[type, ...]] = {
    "hello": (str, dict),  # receiver -> sender: its nonce, the transport's hello
    "challenge": (str, str),  # sender -> receiver: its nonce, its proof of the run's secret
    "proof": (str,),  # receiver -> sender: its proof of the run's secret
    "welcome": (dict,),
    "refused": (str,),  # sender -> a peer it will not serve, with the reason
    "begin": (dict,),
    "bucket": (int, int, list, str),  # buffer index, bytes used, chunk records, the bytes' tag
    "bytes": (int,),  # tcp transport: the bucket's bytes as the frame's one tensor
    "end": (int,),
    "ack": (int,),
    "nack": (int,),  # receiver -> sender: the bucket in this buffer failed its tag; send it again
    "resend": (int,),  # sender -> receiver: that bucket's bytes again, on the control channel
    "abort": (str,),
    "done": (int,),
    "verdict": (bool, str),
    "commit": (),
    "resync": (),
}
"""Kind -> field types of every message of the stream protocol (``stream.py``)."""

Message = tuple[Any, ...]


def dtype_from_name(name: str) -> torch.dtype:
    """The allowed dtype called ``name`` (``"bfloat16"`` or ``"torch.bfloat16"``)."""
    dtype = DTYPES.get(name.removeprefix("torch.")) if isinstance(name, str) else None
    if dtype is None:
        raise WireFormatError(f"unknown or disallowed dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    dtype_from_name(name)
    return name


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


def check_shape(shape: Any, dtype: torch.dtype, nbytes: Any, what: str) -> tuple[int, ...]:
    """``shape`` as a tuple, once it is a list of non-negative ints whose size is ``nbytes`` bytes."""
    if (
        not isinstance(shape, list | tuple)
        or len(shape) > MAX_DIMS
        or not all(type(n) is int and n >= 0 for n in shape)
    ):
        raise WireFormatError(f"{what}: shape {shape!r:.200} is not a list of at most {MAX_DIMS} non-negative integers")
    if type(nbytes) is int and math.prod(shape) * dtype.itemsize == nbytes:
        return tuple(shape)
    raise WireFormatError(
        f"{what}: shape {list(shape)} of {dtype} is {math.prod(shape) * dtype.itemsize} bytes, "
        f"the frame says {nbytes!r}"
    )


def payload_offsets(specs: Sequence[TensorSpec]) -> tuple[list[int], int]:
    """Where each tensor starts in the payload, and the payload's length."""
    offsets, end = [], 0
    for spec in specs:
        start = -(-end // TENSOR_ALIGN_BYTES) * TENSOR_ALIGN_BYTES
        offsets.append(start)
        end = start + spec.nbytes
    return offsets, end


def encode_header(meta_nbytes: int, payload_nbytes: int) -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION, meta_nbytes, payload_nbytes)


def decode_header(data: bytes, max_meta_bytes: int, max_payload_bytes: int) -> tuple[int, int]:
    """(metadata length, payload length) of a header, each within its cap."""
    magic, version, meta_nbytes, payload_nbytes = HEADER.unpack(data)
    if magic != MAGIC:
        raise WireFormatError(f"bad magic {magic!r}: not a weight-sync frame (expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise WireFormatError(f"frame format version {version}, this side speaks {FORMAT_VERSION}")
    if meta_nbytes > max_meta_bytes:
        raise WireFormatError(f"frame declares {meta_nbytes} bytes of metadata, over the cap of {max_meta_bytes}")
    if payload_nbytes > max_payload_bytes:
        raise WireFormatError(
            f"frame declares {payload_nbytes} payload bytes, over the cap of {max_payload_bytes} here"
        )
    return meta_nbytes, payload_nbytes


def encode_meta(message: Message, tensors: Sequence[torch.Tensor]) -> tuple[bytes, list[TensorSpec]]:
    check_message(list(message))
    specs = [TensorSpec(t.dtype, tuple(t.shape), t.numel() * t.element_size()) for t in tensors]
    meta: dict[str, Any] = {"message": list(message)}
    if specs:
        meta["tensors"] = [
            {"dtype": dtype_name(s.dtype), "shape": list(s.shape), "nbytes": s.nbytes} for s in specs
        ]
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode(), specs


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in frame metadata")


def decode_meta(data: bytes | bytearray) -> tuple[Message, list[TensorSpec]]:
    """The message and the payload's tensor specs, validated."""
    try:
        meta = json.loads(bytes(data).decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireFormatError(f"frame metadata is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or "message" not in meta or not meta.keys() <= {"message", "tensors"}:
        raise WireFormatError("frame metadata must be an object with 'message' and optional 'tensors'")
    message = check_message(meta["message"])
    raw_specs = meta.get("tensors", [])
    if not isinstance(raw_specs, list):
        raise WireFormatError("frame metadata: 'tensors' must be a list")
    return message, [_spec(raw, number) for number, raw in enumerate(raw_specs)]


def _spec(raw: Any, number: int) -> TensorSpec:
    what = f"tensor {number} of the frame"
    if not isinstance(raw, dict) or raw.keys() != {"dtype", "shape", "nbytes"}:
        raise WireFormatError(f"{what}: expected dtype, shape and nbytes, got {raw!r:.200}")
    dtype = dtype_from_name(raw["dtype"])
    return TensorSpec(dtype, check_shape(raw["shape"], dtype, raw["nbytes"], what), raw["nbytes"])


def check_message(message: Any) -> Message:
    """``message`` as a tuple, once its kind is known and its fields have the kind's types."""
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise WireFormatError(f"a message is a list that starts with its kind, got {message!r:.200}")
    kind, fields = message[0], message[1:]
    types = MESSAGES.get(kind)
    if types is None:
        raise WireFormatError(f"unknown message kind {kind!r:.100}")
    if len(fields) != len(types) or any(type(f) is not t for f, t in zip(fields, types, strict=False)):
        expected = ", ".join(t.__name__ for t in types) or "no fields"
        raise WireFormatError(f"message {kind!r} needs ({expected}), got {fields!r:.200}")
    return tuple(message)


def tensors_from_payload(payload: torch.Tensor, specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """Views of the uint8 ``payload`` as the specified tensors (no copy)."""
    offsets, end = payload_offsets(specs)
    if payload.numel() != end:
        raise WireFormatError(f"the tensors need {end} payload bytes, the frame carries {payload.numel()}")
    tensors = []
    for spec, start in zip(specs, offsets, strict=True):
        data = payload[start : start + spec.nbytes]
        if spec.dtype == torch.bool and spec.nbytes and int(data.max()) > 1:
            raise WireFormatError("a bool tensor of the frame holds bytes other than 0 and 1")
        tensors.append(data.view(spec.dtype).reshape(spec.shape))
    return tensors


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` as a flat uint8 tensor on the host (a copy only when needed)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


TAG_BYTES = 32
"""Length of a sealed frame's tag (HMAC-SHA256)."""


def encode_frame(
    message: Message, tensors: Sequence[torch.Tensor] = (), seal: Callable[[bytes], bytes] | None = None
) -> list[bytes | memoryview]:
    """The pieces to send, in order: header and metadata (and their tag when ``seal`` is
    given), then each tensor's bytes and padding."""
    meta, specs = encode_meta(message, tensors)
    offsets, end = payload_offsets(specs)
    head = encode_header(len(meta), end) + meta
    pieces: list[bytes | memoryview] = [head + seal(head) if seal is not None else head]
    cursor = 0
    for tensor, start in zip(tensors, offsets, strict=True):
        if start > cursor:
            pieces.append(bytes(start - cursor))
        data = raw_bytes(tensor)
        if data.numel():
            pieces.append(data.numpy().data)  # the array's buffer, no copy
        cursor = start + data.numel()
    return pieces

