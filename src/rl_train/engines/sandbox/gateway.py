"""The trainer's side of a sandbox's gateway: a unix socket in a private folder, relayed to one
TCP endpoint.

The sandbox's network namespace has loopback only; the shim inside listens on 127.0.0.1:PORT
and relays each connection to this socket, bind-mounted into the sandbox. The relay here
connects to the one (host, port) it was given and to nothing else, so the program reaches
that endpoint and no other. The folder and the socket are removed when the relay closes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path

from rl_train.engines.sandbox.shim import pipe

SOCKET_NAME = "gateway.sock"


class GatewayRelay:
    """Listens on ``folder/gateway.sock`` (a fresh 0700 folder) and relays to ``target``, on a
    thread of its own until ``close``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.folder = tempfile.mkdtemp(prefix="rlt-sandbox-gw-")
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sandbox-gateway", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self.close()
            raise RuntimeError(f"sandbox gateway relay could not listen: {self._error}") from self._error

    @property
    def socket_path(self) -> str:
        return str(Path(self.folder, SOCKET_NAME))

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_unix_server(self._relay, self.socket_path)
        except OSError as error:
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        async with server:
            await self._stop.wait()
        relays = asyncio.all_tasks() - {asyncio.current_task()}
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream[1]), pipe(upstream[0], writer))

    def close(self) -> None:
        """Stops listening, drops every connection, removes the folder; idempotent."""
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=5.0)
        shutil.rmtree(self.folder, ignore_errors=True)
