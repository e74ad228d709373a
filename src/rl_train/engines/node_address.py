"""This process's address on its node, as other nodes reach it.

Inside Ray it is the node's IP as Ray knows it (``ray.util.get_node_ip_address``); outside Ray
(a test, a single process) it is loopback. Rendezvous points (a pool's ``torch.distributed``
world, a weight-sync sender) are opened at this address on the node where their owner runs,
never at an address assumed for every node.
"""

from __future__ import annotations

import socket


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def node_address() -> str:
    """``host:port`` on this node, the port free when asked (the OS picks it)."""
    host = node_ip()
    with socket.socket() as sock:
        sock.bind((host, 0))
        return f"{host}:{sock.getsockname()[1]}"


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.")
