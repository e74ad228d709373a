"""The gateway served on 127.0.0.1 from a thread of the process that owns the engine.

``GatewayServer(core).start()`` binds a free port (or the one given), serves until ``stop``,
and ``stop`` closes the listening socket before returning, so no port outlives it.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from rl_train.engines.agent.gateway import create_gateway
from rl_train.engines.agent.gateway_core import GatewayCore


class GatewayServer:
    def __init__(self, core: GatewayCore, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 1 << 20) -> None:
        self.core = core
        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            create_gateway(core, max_body_bytes), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name="gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()
