"""Byte movers under the bucketed and delta backends, in the ``TRANSPORTS`` table.

Each transport is a module of this package defining ``Sender(bucket_size_bytes, host, options)``,
``Receiver(descriptor)`` and ``available()``; ``options`` is the transport's own section of
``rollout.weight_sync`` as plain data, validated at config load (``{}`` for a transport without
one: ``WeightSyncConfig.transport_options``), and a sender that needs it on the receivers puts
it in its descriptor. The table names each transport by import path, so the
config check (in the driver, which never imports torch) imports only the transports that
need more than Python and torch to run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated

from pydantic import AfterValidator

from rl_train.engines.weight_sync.transports.base import PlacesDirect, ReceiverTransport, SenderTransport
from rl_train.registry import Entry, Registry

__all__ = [
    "TRANSPORTS",
    "PlacesDirect",
    "ReceiverTransport",
    "SenderTransport",
    "Transport",
    "TransportName",
    "check_transport_available",
    "get_transport",
]


@dataclass(frozen=True)
class Transport(Entry[ModuleType]):
    """A transport module and what running it takes."""

    install_hint: str = ""
    """What to install where ``available()`` says it cannot run."""
    always_available: bool = False
    """It needs nothing beyond Python and torch: the config check does not import it to ask."""


_HOME = "rl_train.engines.weight_sync.transports."

TRANSPORTS: Registry[Transport] = Registry(
    "weight-sync transport",
    "rollout.weight_sync.transport",
    {
        "shm": Transport(
            _HOME + "shm",
            "the two bucket buffers live in POSIX shared memory that every receiver maps; one host only.",
            always_available=True,
        ),
        "tcp": Transport(
            _HOME + "tcp",
            "bucket bytes follow their announcement on each receiver's control socket; any hosts, nothing to install.",
            always_available=True,
        ),
        "torch_dist": Transport(
            _HOME + "torch_dist",
            "each bucket is a broadcast in a private process group (gloo on CPU, NCCL on GPU).",
            install_hint="a torch build with torch.distributed (gloo on CPU, NCCL on GPU)",
        ),
        "mooncake": Transport(
            _HOME + "mooncake",
            "the sender writes each bucket into the receivers' registered buffers (Mooncake's TransferEngine).",
            install_hint="pip install 'rl-train[mooncake-cpu]' (mooncake-transfer-engine-non-cuda) and "
            "apt-get install -y libibverbs1 on CPU hosts; pip install 'rl-train[mooncake-cuda]' on GPU hosts",
        ),
    },
)

TransportName = Annotated[str, AfterValidator(TRANSPORTS.check)]
"""A config field holding a registered transport name, checked at load."""


def get_transport(name: str) -> ModuleType:
    """The transport module: it defines ``Sender``, ``Receiver`` and ``available()``."""
    return TRANSPORTS.get(name)


def check_transport_available(name: str) -> None:
    """Raise ``ValueError`` with the install hint when ``name`` cannot run on this machine."""
    transport = TRANSPORTS[name]
    if transport.always_available:
        return
    try:
        problem = importlib.import_module(transport.module).available()
    except ImportError as exc:
        problem = str(exc)
    if problem:
        raise ValueError(
            f"weight-sync transport {name!r} is unavailable here ({problem}); install: {transport.install_hint}"
        )
