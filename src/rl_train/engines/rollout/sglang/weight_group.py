"""The weight group of ``rollout.sglang.weight_update: distributed``: a two-party
``torch.distributed`` group the sglang server joins (``/init_weights_update_group``), over which
each update is broadcast while ``/update_weights_from_distributed`` tells the server the
tensors' names, dtypes and shapes. NCCL on a GPU, gloo on CPU.
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import torch

from rl_train.engines.rollout.sglang.client import RolloutServerError, SglangClient
from rl_train.engines.rollout.sglang.config import SglangConfig

GROUP_NAME = "rl_train_weights"


def open_group(client: SglangClient, cfg: SglangConfig) -> tuple[Any, Any]:
    """A two-party group with the server (this replica rank 0, the server's ranks after it),
    and its rendezvous store, which must live as long as the group."""
    import torch.distributed as dist

    info = client.call("/get_server_info", method="GET") or {}
    server_ranks = int(info.get("tp_size", 1)) if isinstance(info, dict) else 1
    host = cfg.group_address or (urlparse(client.url).hostname if cfg.url else "127.0.0.1")
    if not host:
        raise RolloutServerError(
            f"rollout.sglang.url {client.url!r} names no host for the weight group; "
            "set rollout.sglang.group_address"
        )
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    world = 1 + server_ranks
    store = dist.TCPStore(host, port, world, is_master=True, wait_for_workers=False)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo" and host in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo picks the loopback device too
    body = {
        "master_address": host,
        "master_port": port,
        "rank_offset": 1,
        "world_size": world,
        "group_name": GROUP_NAME,
        "backend": backend,
    }
    with ThreadPoolExecutor(1, "sglang-weights") as pool:  # the server answers once it has joined
        joined = pool.submit(client.call, "/init_weights_update_group", body)
        # the bindings default the timeout and the options, which torch's stubs leave out
        group = (
            dist.ProcessGroupGloo(store, 0, world)  # type: ignore[call-arg]
            if backend == "gloo"
            else dist.ProcessGroupNCCL(store, 0, world)  # type: ignore[call-arg]
        )
        joined.result()
    return group, store


def broadcast_weights(
    client: SglangClient, group: Any, tensors: list[tuple[str, torch.Tensor]], version: int
) -> None:
    """Tell the server the tensors' names, dtypes and shapes, and broadcast them over ``group``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    body = {
        "names": [name for name, _ in tensors],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
        "shapes": [list(t.shape) for _, t in tensors],
        "group_name": GROUP_NAME,
        "flush_cache": True,
        "weight_version": str(version),
    }
    with ThreadPoolExecutor(1, "sglang-weights") as pool:  # the server answers once it has received
        loaded = pool.submit(client.call, "/update_weights_from_distributed", body)
        for _, tensor in tensors:
            group.broadcast(tensor.detach().to(device).contiguous(), 0).wait()
        loaded.result()
