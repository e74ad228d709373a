"""An ASGI app served by uvicorn on a socket bound up front: the gateway's and the reward server's.

Binding first gives the port at once (port 0: a free one) and lets the caller refuse a host
before anything listens. ``start`` serves from a daemon thread and returns once it answers;
``serve`` runs in the foreground until SIGINT or SIGTERM. Both close the listening socket
before they return (``stop`` for the thread), so no port outlives the server.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, TypeVar

import uvicorn

ServerT = TypeVar("ServerT", bound="ThreadedServer")


class ThreadedServer:
    label = "server"
    """Named in the thread and in the error of a server that did not start."""

    def __init__(self, app: Any, host: str, port: int, limit_concurrency: int | None = None) -> None:
        self.host = host
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
            limit_concurrency=limit_concurrency,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        """Serve in this thread until SIGINT or SIGTERM."""
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def start(self: ServerT, timeout_s: float = 30.0) -> ServerT:
        """Serve from a daemon thread; returns once the server is up (``RuntimeError`` past ``timeout_s``)."""
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name=self.label, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.label} did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()
