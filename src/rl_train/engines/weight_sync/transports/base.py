"""The transport interface: move one of two bucket buffers from the sender to every receiver.

The stream (``stream.py``) owns the control channel, the packing and the acks; a transport
only moves bytes. ``data_before_meta`` says in which order a bucket goes out: memory
transports (shared memory, Mooncake writes into the receiver's registered buffers) place
the bytes first and then announce them; stream transports (a socket, a collective) announce
first so the receiver knows how many bytes to read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the config check imports this in the driver, which never imports torch
    import torch

    from rl_train.engines.weight_sync.wire import Channel, Deadline


class SenderTransport(Protocol):
    data_before_meta: bool
    buffers: list[torch.Tensor]
    """Two uint8 buffers of ``bucket_size_bytes`` that the packer fills in turn."""

    def descriptor(self) -> dict[str, Any]: ...

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Given each receiver's hello, the welcome each one gets (ranks, addresses)."""
        ...

    def attach(self, conns: list[Channel], deadline: Deadline, key: bytes) -> None:
        """Finish connecting once every receiver got its welcome. ``conns`` are the receivers'
        sealed control channels; ``key`` is derived from the run's secret and this sender's
        stream nonce (the receivers derive the same), for a transport that authenticates its
        own rendezvous."""
        ...

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        """Deliver ``buffers[index][:nbytes]`` to every receiver."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class PlacesDirect(Protocol):
    """Optional on a sender transport: send big chunks from the exported tensors' own memory.

    The packer offers each chunk to ``place_direct`` (the ``Direct`` hook of ``pack_buckets``)
    instead of copying it into the bucket; ``release`` forgets what buffer ``index`` took
    once that bucket was written or abandoned.
    """

    def place_direct(self, index: int, offset: int, data: torch.Tensor) -> bool: ...

    def release(self, index: int) -> None: ...

    def pieces(self, index: int, nbytes: int) -> list[torch.Tensor]:
        """The bytes of bucket ``index`` in order, direct chunks included (what its tag covers)."""
        ...


class ReceiverTransport(Protocol):
    shared_buffers: bool
    """True when other processes can write the buffers ``pull`` returns (shared memory, registered
    RDMA/TCP buffers): the stream then checks a private copy, never the buffer itself."""

    def hello(self) -> dict[str, Any]: ...

    def attach(self, welcome: dict[str, Any], channel: Channel, deadline: Deadline, key: bytes) -> None: ...

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        """The bytes of bucket buffer ``index``, valid until the bucket is acked."""
        ...

    def close(self) -> None: ...
