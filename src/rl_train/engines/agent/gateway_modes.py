"""How a gateway agent runs (``rollout.agent.gateway_mode``): one entry per mode.

The config's checks and the gateway's runs read what a mode *is* from its entry (whether it
runs a program nobody vetted, how an agent starts); no code compares a mode's name. The table
names each launcher by import path, so the config reads it without importing the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl_train.registry import Entry, Registry

Launcher = Callable[[Any], Callable[[str, str, str], Any]]
"""``(the gateway's runs) -> (request id, session token, task) -> a running agent``."""


@dataclass(frozen=True)
class GatewayMode(Entry[Launcher]):
    """A way to run a black-box agent against the gateway."""

    runs_untrusted_program: bool = True
    """It runs ``gateway_command``, a program nobody vetted (in the sandbox, a process group of
    its own, killed at the deadline); else ``gateway_program``, trusted code on a thread."""


_RUNS = "rl_train.engines.agent.gateway_runs:"

GATEWAY_MODES: Registry[GatewayMode] = Registry(
    "gateway mode",
    "rollout.agent.gateway_mode",
    {
        "process": GatewayMode(
            _RUNS + "process_launcher",
            "gateway_command in the sandbox, a process group of its own, killed as a group at the deadline",
        ),
        "in_process": GatewayMode(
            _RUNS + "thread_launcher",
            "gateway_program on a thread of the replica (trusted code only: at the deadline its session closes)",
            runs_untrusted_program=False,
        ),
    },
)
