"""``torch_dist``: each bucket is a broadcast in a private process group (gloo on CPU, NCCL on GPU).

The group is built from its own ``TCPStore`` and never touches the default process group,
so a training engine that already runs torch.distributed for data parallelism is not
disturbed. Rank 0 is the sender; receivers get ranks 1..N in the order they connected.
The store speaks c10d's own protocol (no pickle) and has no authentication, so every key
lives under a random prefix that only the descriptor carries: a client that finds the port
cannot name the rendezvous keys.
"""

from __future__ import annotations

import datetime
import secrets
import socket
from typing import Any

import torch

from rl_train.engines.weight_sync.errors import TransportError, WireFormatError
from rl_train.engines.weight_sync.wire import Deadline


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


def _group(store: Any, prefix: str, rank: int, world_size: int, timeout_seconds: float) -> Any:
    from torch.distributed import PrefixStore, ProcessGroupGloo

    store = PrefixStore(prefix, store)
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
        self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        self._prefix = f"rlws/{secrets.token_hex(16)}"
        self.buffers = [torch.empty(bucket_size_bytes, dtype=torch.uint8, device=_device()) for _ in range(2)]
        self._group: Any = None
        self._world_size = 0

    def descriptor(self) -> dict[str, Any]:
        return {"store_host": self._host, "store_port": self._store.port, "store_prefix": self._prefix}

    def plan(self, hellos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._world_size = len(hellos) + 1
        return [{"rank": rank + 1, "world_size": self._world_size} for rank in range(len(hellos))]

    def attach(self, conns: list[socket.socket], deadline: Deadline) -> None:
        seconds = deadline.remaining("waiting for the receivers to join the process group")
        self._store.set_timeout(datetime.timedelta(seconds=seconds))
        try:
            self._group = _group(self._store, self._prefix, 0, self._world_size, seconds)
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


class Receiver:
    def __init__(self, descriptor: dict[str, Any]) -> None:
        self._descriptor = descriptor
        self._group: Any = None
        self._buffer: torch.Tensor | None = None

    def hello(self) -> dict[str, Any]:
        return {}

    def attach(self, welcome: dict[str, Any], sock: socket.socket, deadline: Deadline) -> None:
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
            self._group = _group(store, self._descriptor["store_prefix"], rank, world_size, seconds)
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
