"""Prefect's temporary API server for one ``rl-train`` process, started at the very beginning.

Without ``PREFECT_API_URL`` a Prefect process starts a throwaway local API server (uvicorn
serving ``prefect.server.api.server:create_app`` on SQLite) the first time it needs one, and
first imports Prefect's whole server package to do so: about 3 s of CPU in the driver before
the server process even starts, then 3-4 s more until it answers. ``TemporaryPrefectAPI``
starts the same server, with the same settings, as the first thing a run does, without
importing Prefect at all; the driver imports its modules while the server comes up, and
``PREFECT_API_URL`` (set before Prefect is imported) points this process's client at it.

The server never outlives its run: it is stopped at exit, and it gets SIGTERM when the
process that started it dies, even by SIGKILL (Linux's parent-death signal), so no process
and no port is left behind. It runs in a session of its own, so that Ctrl-C in a terminal
reaches the run, which then reports its state to a server that is still up.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rl_train.child_process import free_port, own_session_ended_with_parent

TEMPORARY_API_ENV = "RL_TRAIN_TEMPORARY_PREFECT_API"
"""Set (to the URL) in a process whose ``PREFECT_API_URL`` is this module's temporary server,
so that code asking "did the user configure a server?" can tell the two apart."""
APP_FACTORY = "rl_train.flows.prefect_app:create_app"
"""What Prefect's own temporary server serves (``SubprocessASGIServer``'s
``prefect.server.api.server:create_app``), behind a retry of its own SQLite lock conflicts
(``flows/prefect_app.py``)."""
PORT_IN_USE_EXIT = 3
"""uvicorn's exit status when its port was taken between choosing and binding it."""
STOP_GRACE_S = 5.0

class PrefectAPIError(RuntimeError):
    """The temporary API server did not come up."""


def user_configured_api() -> bool:
    """Whether ``PREFECT_API_URL`` names a server of the user's (not this module's)."""
    url = os.environ.get("PREFECT_API_URL")
    return bool(url) and url != os.environ.get(TEMPORARY_API_ENV)


def _prefect_package_dir() -> str:
    """Where ``prefect`` is installed, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.submodule_search_locations:
        raise PrefectAPIError("prefect is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))).parent)


def prefect_database() -> str:
    """Where the temporary server keeps its database: ``PREFECT_API_DATABASE_CONNECTION_URL``,
    else ``prefect.db`` under ``PREFECT_HOME`` (``~/.prefect``), shared by every Prefect on the
    machine that has the same home."""
    url = os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL")
    if url:
        return url
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    return str(home / "prefect.db")


def database_hint(output: str) -> str:
    """What to do when the server refused its database (empty when that is not why it died):
    a newer Prefect in another environment migrated it to a revision this one does not have."""
    if "Can't locate revision" not in output:
        return ""
    from importlib.metadata import version

    return (
        f"\nrl-train: Prefect {version('prefect')}'s server cannot read the database {prefect_database()}: "
        "a newer Prefect has migrated it (Alembic names a revision this version does not have). Give this "
        "environment a Prefect home of its own (export PREFECT_HOME=<a new folder>), point it at another "
        "database (PREFECT_API_DATABASE_CONNECTION_URL), or install the Prefect that migrated it."
    )


class TemporaryPrefectAPI:
    """One throwaway Prefect API server (see the module docstring). ``start`` must be called
    from a thread that lives as long as the server should (the main thread): the parent-death
    signal follows the thread that started the process."""

    def __init__(self, startup_timeout_s: float = 180.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log = tempfile.TemporaryFile(prefix="rlt-prefect-api-")  # noqa: SIM115 (closed in stop)
        self._lock = threading.Lock()  # stop() from atexit and from an error path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> str:
        """Launch the server and point this process's Prefect at it; returns its API URL."""
        self._launch()
        os.environ["PREFECT_API_URL"] = self.url
        os.environ[TEMPORARY_API_ENV] = self.url
        atexit.register(self.stop)
        return self.url

    def _launch(self) -> None:
        self.port = free_port()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        command = [
            sys.executable, "-m", "uvicorn", "--app-dir", _prefect_package_dir(), "--factory",
            APP_FACTORY, "--host", "127.0.0.1", "--port", str(self.port),
            "--log-level", "error", "--lifespan", "on",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=self._log, preexec_fn=own_session_ended_with_parent
        )

    def wait_ready(self) -> None:
        """Block until the server answers its health check; raises ``PrefectAPIError`` with its
        output if it died or does not answer in time. (Any thread: this process's Prefect reads
        the URL once, so a server that lost its port is an error, not a relaunch elsewhere.)"""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None, "start() first"
            code = self.process.poll()
            if code is not None:
                why = f"port {self.port} was taken meanwhile" if code == PORT_IN_USE_EXIT else f"status {code}"
                output = self._output()
                self.stop()
                raise PrefectAPIError(f"Prefect's temporary API server exited ({why}):\n{output}{database_hint(output)}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.05)
        output = self._output()
        self.stop()
        raise PrefectAPIError(
            f"Prefect's temporary API server did not answer within {self.startup_timeout_s:.0f} s "
            f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)\n{output}"
        )

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:].decode(errors="replace")

    def stop(self) -> None:
        """Stop the server (idempotent); waits for it to exit, then kills it if it must."""
        with self._lock:
            process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()
