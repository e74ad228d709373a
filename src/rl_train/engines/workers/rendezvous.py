"""Where the ranks of a pool meet: an address on the node its rank 0 landed on.

A pool's ranks are created first, without a ``torch.distributed`` world; rank 0 then names an
address on its own node (``rl_train.engines.node_address``: the node's IP as Ray knows it, a
port the OS picked there), and every rank joins the world there (``join_world``). Nothing assumes that
the ranks share a host: on a Ray cluster they may not. Loopback is used only where it is the
truth: a process outside Ray, or a node whose own address is loopback.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from rl_train.engines.node_address import is_loopback, node_address

__all__ = ["join_world", "node_address"]


def join_world(address: str, rank: int, world_size: int, backend: str = "gloo") -> None:
    """Join the world of ``world_size`` ranks that meets at ``address`` (rank 0 serves it).
    Over loopback gloo is pinned to the loopback device; otherwise it uses the interface
    that reaches the node's address."""
    if is_loopback(address.rsplit(":", 1)[0]):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=world_size)
