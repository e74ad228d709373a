"""``torch_dist``: each bucket is a broadcast in a private process group (gloo on CPU, NCCL on GPU).

The group is built from its own ``TCPStore`` and never touches the default process group,
so a training engine that already runs torch.distributed for data parallelism is not
disturbed. Rank 0 is the sender; receivers get ranks 1..N in the order they connected.

The store listens on the sender's address only (a socket bound here, handed to the store as
``master_listen_fd``), never on every interface. It speaks c10d's own protocol (no pickle)
and checks no identity: any client that reaches the port can list, read and write keys. So
the group sees the store only through ``authenticated_store``: each key's name is an HMAC of
it under a key derived from the run's secret (a client that lists keys learns nothing it can
name), and each value carries an HMAC of its name and bytes, checked on every read (a client
that writes a value cannot forge one, so it cannot join the group or redirect a rank; it can
only make the rendezvous fail, loudly).
"""

from __future__ import annotations

import datetime
import hmac
from typing import Any

import torch

from rl_train.engines.weight_sync import wire
from rl_train.engines.weight_sync.errors import IntegrityError, TransportError, WireFormatError
from rl_train.engines.weight_sync.wire import Channel, Deadline

STORE_TAG_BYTES = 32
_STORE_CLASS: list[type] = []


def available() -> str:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch was built without torch.distributed"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend"
    return ""


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def authenticated_store(store: Any, key: bytes) -> Any:
    """``store`` seen through HMAC-named keys and HMAC-tagged values (the module's docstring)."""
    if not _STORE_CLASS:
        _STORE_CLASS.append(_define_store_class())
    return _STORE_CLASS[0](store, key)


def _define_store_class() -> type:
    """Defined on first use: subclassing ``Store`` imports torch.distributed, which the config
    check (it imports this module to ask ``available()``) must not need."""
    from torch.distributed import Store

    class AuthenticatedStore(Store):
        """What the process group's rendezvous uses of a store (set, get, wait, check, add)."""

        def __init__(self, inner: Any, key: bytes) -> None:
            super().__init__()
            self._inner, self._key = inner, key

        def _name(self, name: str) -> str:
            return "rlws/" + hmac.digest(self._key, b"name\0" + name.encode(), "sha256").hex()

        def _tag(self, name: str, value: bytes) -> bytes:
            return hmac.digest(self._key, b"value\0" + name.encode() + b"\0" + value, "sha256")

        def set(self, name: str, value: Any) -> None:
            data = value.encode() if isinstance(value, str) else bytes(value)
            self._inner.set(self._name(name), self._tag(name, data) + data)

        def get(self, name: str) -> bytes:
            raw = bytes(self._inner.get(self._name(name)))
            tag, value = raw[:STORE_TAG_BYTES], raw[STORE_TAG_BYTES:]
            if not hmac.compare_digest(tag, self._tag(name, value)):
                raise IntegrityError(
                    f"the rendezvous value of {name!r} in the TCPStore failed its MAC check: "
                    "written by a client that does not know the run's secret"
                )
            return value

        def add(self, name: str, amount: int) -> int:  # a counter carries no tag; it names no address
            return int(self._inner.add(self._name(name), amount))

        def wait(self, names: list[str], timeout: datetime.timedelta | None = None) -> None:
            hashed = [self._name(name) for name in names]
            self._inner.wait(hashed) if timeout is None else self._inner.wait(hashed, timeout)

        def check(self, names: list[str]) -> bool:
            return bool(self._inner.check([self._name(name) for name in names]))

        def delete_key(self, name: str) -> bool:
            return bool(self._inner.delete_key(self._name(name)))

        def set_timeout(self, timeout: datetime.timedelta) -> None:
            self._inner.set_timeout(timeout)

        def num_keys(self) -> int:
            return int(self._inner.num_keys())

    return AuthenticatedStore


def _group(store: Any, rank: int, world_size: int, timeout_seconds: float) -> Any:
    from torch.distributed import ProcessGroupGloo

    timeout = datetime.timedelta(seconds=timeout_seconds)
    if _device().type == "cuda":
        from torch.distributed import ProcessGroupNCCL

        return ProcessGroupNCCL(store, rank, world_size, ProcessGroupNCCL.Options())  # the default options
    return ProcessGroupGloo(store, rank, world_size, timeout)


def _broadcast(group: Any, tensor: torch.Tensor, deadline: Deadline, waiting_for: str) -> None:
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()
    options.rootRank = 0
    work = group.broadcast([tensor], options)
    try:
        work.wait(datetime.timedelta(seconds=deadline.remaining(waiting_for)))
    except RuntimeError as exc:
        raise TransportError(f"broadcast failed {waiting_for}: {exc}") from exc


class Sender:
    data_before_meta = False

    def __init__(self, bucket_size_bytes: int, host: str, options: dict[str, Any]) -> None:
        from torch.distributed import TCPStore

        self._host = host
        listener = wire.listen(host)  # bound to the address the ranks use, not to every interface
        port = listener.getsockname()[1]
        self._store: Any = TCPStore(  # owns the listening socket from here on, and closes it
            host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach()
        )
        self.buffers = [torch.empty(bucket_size_bytes, dtype=torch.uint8, device=_device()) for _ in range(2)]
        self._group: Any = None
        self._world_size = 0

    def descriptor(self) -> dict[str, Any]:
        return {"store_host": self._host, "store_port": self._store.port}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._world_size = len(hellos) + 1
        return [{"rank": rank + 1, "world_size": self._world_size} for rank in range(len(hellos))]

    def attach(self, conns: list[Channel], deadline: Deadline, key: bytes) -> None:
        seconds = deadline.remaining("waiting for the receivers to join the process group")
        self._store.set_timeout(datetime.timedelta(seconds=seconds))
        try:
            self._group = _group(authenticated_store(self._store, key), 0, self._world_size, seconds)
        except RuntimeError as exc:  # DistStoreError on timeout: a receiver never joined
            raise TransportError(
                f"timed out after {seconds:.1f} s waiting for {self._world_size - 1} receiver(s) "
                f"to join the torch.distributed process group: {exc}"
            ) from exc

    def push(self, index: int, nbytes: int, deadline: Deadline) -> None:
        _broadcast(
            self._group, self.buffers[index][:nbytes], deadline, "broadcasting a bucket to the receivers"
        )

    def close(self) -> None:
        self._group = None
        self._store = None


class Receiver:
    shared_buffers = False

    def __init__(self, descriptor: dict[str, Any]) -> None:
        self._descriptor = descriptor
        self._group: Any = None
        self._buffer: torch.Tensor | None = None

    def hello(self) -> dict[str, Any]:
        return {}

    def attach(self, welcome: dict[str, Any], channel: Channel, deadline: Deadline, key: bytes) -> None:
        from torch.distributed import TCPStore

        rank, world_size = welcome.get("rank"), welcome.get("world_size")
        if type(rank) is not int or type(world_size) is not int or not 0 < rank < world_size:
            raise WireFormatError(f"the welcome needs a rank in [1, world_size), got {welcome!r:.200}")
        seconds = deadline.remaining("waiting to join the sender's process group")
        timeout = datetime.timedelta(seconds=seconds)
        store = TCPStore(
            self._descriptor["store_host"], self._descriptor["store_port"], is_master=False, timeout=timeout
        )
        try:
            self._group = _group(authenticated_store(store, key), rank, world_size, seconds)
        except RuntimeError as exc:
            raise TransportError(
                f"could not join the sender's torch.distributed process group: {exc}"
            ) from exc

    def pull(self, index: int, nbytes: int, deadline: Deadline) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=_device())
        view = self._buffer[:nbytes]
        _broadcast(self._group, view, deadline, "waiting for a bucket broadcast from the sender")
        return view  # on GPU the engine copies device to device

    def close(self) -> None:
        self._group = None
        self._buffer = None
