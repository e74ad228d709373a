"""The gateway served on 127.0.0.1 from a thread of the process that owns the engine.

``GatewayServer(core).start()`` binds a free port (or the one given), serves until ``stop``,
and ``stop`` closes the listening socket before returning, so no port outlives it. The limits
of what it accepts are ``GatewayLimits`` (``gateway.py``).
"""

from __future__ import annotations

from rl_train.engines.agent.gateway import GatewayLimits, create_gateway
from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.threaded_server import ThreadedServer


class GatewayServer(ThreadedServer):
    label = "gateway"

    def __init__(self, core: GatewayCore, host: str = "127.0.0.1", port: int = 0, limits: GatewayLimits | None = None) -> None:
        self.core = core
        self.limits = limits or GatewayLimits()
        self.app = create_gateway(core, self.limits)
        super().__init__(self.app, host, port, limit_concurrency=self.limits.max_connections)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"
