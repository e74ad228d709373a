"""The control channel's frames: bit-exact tensors, and a clear error for every malformed frame.

Frames go through a real socket pair; the writer closes its end after the bytes, so a
reader that waited for more than was sent would see the end of the stream, and one that
hung would trip the deadline. Every malformed frame must raise ``TransportError`` (most
of them its ``WireFormatError``) with a message, and nothing else.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_train.engines.weight_sync import frame, wire
from rl_train.engines.weight_sync.buckets import ChunkMeta
from rl_train.engines.weight_sync.delta_codec import decode_flushes
from rl_train.engines.weight_sync.errors import TransportError, WireFormatError
from rl_train.engines.weight_sync.wire import Deadline

CAP = 1 << 20


def read_back(data: bytes, max_payload_bytes: int = CAP, timeout_seconds: float = 5.0) -> tuple:
    """Write ``data`` into one end of a socket pair, close it, read one frame from the other end."""
    writer, reader = socket.socketpair()
    sender = threading.Thread(target=_write_and_close, args=(writer, data))
    sender.start()
    try:
        return wire.recv_frame(reader, Deadline(timeout_seconds), "in the test", max_payload_bytes)
    finally:
        sender.join()
        reader.close()


def _write_and_close(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the reader stopped early, as it should on a bad header
    finally:
        sock.close()


def encoded(message: tuple, tensors: list[torch.Tensor] = ()) -> bytes:  # type: ignore[assignment]
    return b"".join(bytes(piece) for piece in frame.encode_frame(message, tensors))


def raw_frame(meta: object, payload: bytes = b"", magic: bytes = frame.MAGIC, version: int = frame.FORMAT_VERSION) -> bytes:
    body = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return frame.HEADER.pack(magic, version, len(body), len(payload)) + body + payload


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


def test_every_allowed_dtype_round_trips_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for dtype in frame.DTYPES.values():
        raw = torch.randint(0, 256, (3, 5 * dtype.itemsize), dtype=torch.uint8, generator=generator)
        tensors.append(raw.view(dtype) if dtype != torch.bool else raw % 2 == 1)
    special = torch.tensor([-0.0, float("nan"), float("inf"), 1e-40])  # sign, NaN, subnormal bits
    nan_payload = torch.tensor([0x7FC1, -0x7F], dtype=torch.int16).view(torch.bfloat16)  # 0x7FC1, 0xFF81: NaNs
    tensors += [special, nan_payload, torch.tensor(0.125), torch.empty(0, 4), torch.randn(4, 6).t()]
    message, received = read_back(encoded(("bytes", 1), tensors))
    assert message == ("bytes", 1)
    assert len(received) == len(tensors)
    assert all(same_bits(got, sent) for got, sent in zip(received, tensors, strict=True))


def test_messages_round_trip_as_tuples() -> None:
    hello = ("hello", "ab" * 32, {"session": "10.0.0.1:1234", "addresses": [1 << 40, 7]})
    assert read_back(encoded(hello)) == (hello, [])
    assert read_back(encoded(("verdict", False, "checksum mismatch in flush 0"))) == (
        ("verdict", False, "checksum mismatch in flush 0"),
        [],
    )


VALID_META = {"message": ["bytes", 0], "tensors": [{"dtype": "float32", "shape": [2], "nbytes": 8}]}
MALFORMED = {
    "empty stream": (b"", TransportError, "the peer closed the connection"),
    "truncated header": (encoded(("ack", 0))[:7], WireFormatError, "after 7 of 20 header bytes"),
    "wrong magic": (raw_frame(VALID_META, bytes(8), magic=b"GET "), WireFormatError, "bad magic b'GET '"),
    "pickle bytes": (b"\x80\x04\x95" + bytes(40), WireFormatError, "bad magic"),
    "future version": (raw_frame(VALID_META, bytes(8), version=9), WireFormatError, "format version 9"),
    "huge metadata length": (
        frame.HEADER.pack(frame.MAGIC, frame.FORMAT_VERSION, 2**32 - 1, 0),
        WireFormatError,
        "4294967295 bytes of metadata, over the cap",
    ),
    "huge payload length": (
        frame.HEADER.pack(frame.MAGIC, frame.FORMAT_VERSION, 2, 2**63) + b"{}",
        WireFormatError,
        f"{2**63} payload bytes, over the cap",
    ),
    "truncated metadata": (raw_frame(VALID_META)[:30], WireFormatError, "truncated frame"),
    "truncated payload": (raw_frame(VALID_META, bytes(8))[:-3], WireFormatError, "after 5 of 8 payload bytes"),
    "bad json": (raw_frame(b'{"message": ["ack", 0'), WireFormatError, "not valid JSON"),
    "not utf-8": (raw_frame(b"\xff\xfe"), WireFormatError, "not valid JSON"),
    "nan constant": (raw_frame(b'{"message": ["ack", NaN]}'), WireFormatError, "NaN is not allowed"),
    "deep nesting": (raw_frame(b"[" * 100000 + b"]" * 100000), WireFormatError, "not valid JSON"),
    "not an object": (raw_frame(["ack", 0]), WireFormatError, "must be an object"),
    "extra key": (raw_frame({"message": ["ack", 0], "code": "os.system"}), WireFormatError, "must be an object"),
    "unknown kind": (raw_frame({"message": ["exec", "rm -rf /"]}), WireFormatError, "unknown message kind 'exec'"),
    "wrong field type": (raw_frame({"message": ["ack", "0"]}), WireFormatError, "message 'ack' needs (int)"),
    "bool for int": (raw_frame({"message": ["ack", True]}), WireFormatError, "message 'ack' needs (int)"),
    "missing field": (raw_frame({"message": ["verdict", True]}), WireFormatError, "needs (bool, str)"),
    "unknown dtype": (
        raw_frame({"message": ["bytes", 0], "tensors": [{"dtype": "object", "shape": [1], "nbytes": 8}]}, bytes(8)),
        WireFormatError,
        "unknown or disallowed dtype 'object'",
    ),
    "shape and bytes disagree": (
        raw_frame({"message": ["bytes", 0], "tensors": [{"dtype": "float32", "shape": [3], "nbytes": 8}]}, bytes(8)),
        WireFormatError,
        "shape [3] of torch.float32 is 12 bytes, the frame says 8",
    ),
    "negative dimension": (
        raw_frame({"message": ["bytes", 0], "tensors": [{"dtype": "uint8", "shape": [-8], "nbytes": 8}]}, bytes(8)),
        WireFormatError,
        "not a list of at most 64 non-negative integers",
    ),
    "payload longer than tensors": (raw_frame(VALID_META, bytes(16)), WireFormatError, "need 8 payload bytes"),
    "bool bytes": (
        raw_frame({"message": ["bytes", 0], "tensors": [{"dtype": "bool", "shape": [2], "nbytes": 2}]}, b"\x01\x07"),
        WireFormatError,
        "bytes other than 0 and 1",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_frame_gives_a_clear_error(case: str) -> None:
    data, error, message = MALFORMED[case]
    started = time.monotonic()
    with pytest.raises(error) as failure:
        read_back(data)
    assert message in str(failure.value)
    assert time.monotonic() - started < 3.0  # decided from what arrived, never by waiting out the deadline


def test_a_message_may_not_carry_a_payload() -> None:
    writer, reader = socket.socketpair()
    with writer, reader:
        writer.sendall(raw_frame(VALID_META, bytes(8)))
        with pytest.raises(WireFormatError, match="8 payload bytes, over the cap of 0"):
            wire.recv_message(reader, Deadline(2.0), "in the test")


def test_a_silent_peer_times_out_naming_the_wait() -> None:
    writer, reader = socket.socketpair()
    with writer, reader:
        writer.sendall(encoded(("ack", 0))[:5])  # and then nothing, but the connection stays open
        with pytest.raises(TransportError, match="timed out after 0.3 s waiting for a test frame"):
            wire.recv_frame(reader, Deadline(0.3), "waiting for a test frame", 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_but_a_transport_error(data: bytes) -> None:
    try:
        message, _ = read_back(data)
    except TransportError as exc:
        assert str(exc)
        return
    assert message[0] in frame.MESSAGES


SAMPLE = encoded(("bytes", 1), [torch.arange(6, dtype=torch.int16), torch.tensor([True, False])])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), max_size=4),
    st.integers(0, len(SAMPLE)),
)
def test_damaged_frames_decode_or_fail_cleanly(edits: list[tuple[int, int]], length: int) -> None:
    # Bytes overwritten anywhere (header lengths included), then the frame cut short.
    damaged = bytearray(SAMPLE)
    for position, value in edits:
        damaged[position] = value
    try:
        message, tensors = read_back(bytes(damaged[:length]))
    except TransportError as exc:
        assert str(exc)
        return
    assert message[0] in frame.MESSAGES
    assert all(t.dtype in frame.DTYPES.values() for t in tensors)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (["w", "torch.float32", [2, 2], 16, 0, 0, 16], None),
        (["w", "torch.float32", [2, 2], 12, 0, 0, 12], "is 16 bytes, the frame says 12"),
        (["w", "torch.pickle", [4], 4, 0, 0, 4], "unknown or disallowed dtype"),
        (["w", "torch.float32", [4], 16, 8, 0, 16], "lie outside the tensor or bucket"),
        (["w", "torch.float32", [64], 256, 0, 0, 256], "lie outside the tensor or bucket"),
        (["w", "torch.float32", [4], 16, 0, 2, 16], "must start aligned"),
        (["w", "torch.float32", [4], 16, 0, -1, 16], "non-negative integers"),
        (["w", "torch.float32", [4], 16, 0, 0], "malformed chunk record"),
    ],
)
def test_chunk_records_must_describe_bytes_inside_the_bucket(record: list, reason: str | None) -> None:
    if reason is None:
        assert ChunkMeta.from_wire(record, 128) == ChunkMeta("w", "torch.float32", (2, 2), 16, 0, 0, 16)
        return
    with pytest.raises(WireFormatError, match=reason):
        ChunkMeta.from_wire(record, 128)


def test_chunk_records_round_trip_through_json() -> None:
    chunk = ChunkMeta("model.embed", "torch.bfloat16", (3, 5), 30, 10, 64, 20)
    assert ChunkMeta.from_wire(json.loads(json.dumps(chunk.to_wire())), 128) == chunk


@pytest.mark.parametrize(
    ("items", "reason"),
    [
        ([("x/w/index", torch.zeros(1))], "does not start with a flush number"),
        ([("0/w/values", torch.zeros(1))], "out of order"),
        ([("0/#checksum", torch.zeros(1))], "not an int64"),
        ([("0/w/index", torch.zeros(1)), ("0/w/index", torch.zeros(1))], "out of order"),
    ],
)
def test_delta_items_off_the_encoding_are_refused(items: list, reason: str) -> None:
    with pytest.raises(WireFormatError, match=reason):
        decode_flushes(items)


def test_header_layout_is_fixed() -> None:
    # magic (4) | version (1) | reserved (3) | metadata length (u32) | payload length (u64), big-endian
    assert frame.HEADER.size == 20
    assert frame.encode_header(3, 258) == b"RLWS\x02\x00\x00\x00" + struct.pack("!I", 3) + struct.pack("!Q", 258)
