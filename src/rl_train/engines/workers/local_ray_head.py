"""A local Ray head with only the processes a training run uses.

``ray.init()`` on a fresh machine starts, besides the GCS and the raylet (with its two agents),
three Python processes of its own: the dashboard's API server (started even with
``include_dashboard=False``, then loading only the usage-stats module), the autoscaler's monitor
and the log monitor. A run of rl-train uses none of the first two: it reads no Ray dashboard,
submits no Ray jobs and never autoscales a local node. On two cores they cost about 2.5 s of
CPU during start-up, and ``ray.init`` waits up to a second for the API server to answer
before it even starts the raylet.

``start_local_head`` starts the same node ``ray.init()`` would, through the same code
(``ray._private.node.Node``, as ``ray.init`` calls it), minus those two processes; the log
monitor is kept, so the actors' output still reaches the driver's terminal. The driver then
connects with ``ray.init(address=...)``. At interpreter exit the driver is disconnected and
the node's processes are stopped.

A driver that dies without its exit hooks (SIGKILL, the OOM killer, a SIGTERM it does not
handle) takes the GCS and the raylet with it (Linux's parent-death signal, as Ray sets it),
and the workers follow the raylet; but the raylet's two agents notice, log "the parent is
dead", call ``sys.exit`` from a background task and stay alive, holding their ports, with
``ray.init()``'s node as with this one. ``start_local_head`` therefore leaves a watchdog: a
small process that reads a pipe from the driver and, at its end-of-file (the driver gone,
however it went), kills the agents it was given, each checked by its start time so that a
reused pid is never hit.

The node class is Ray's private API: ``pyproject.toml`` pins Ray's minor release, and where
the class is missing or its signature changed, ``start_local_head`` returns None and the
caller falls back to a plain ``ray.init`` (``tests/integration/test_local_ray_head.py`` holds the
pinned release to the lean path).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from rl_train.child_process import proc_children, proc_stat_fields

logger = logging.getLogger(__name__)


def _lean_node_class() -> type | None:
    try:
        from ray._private.node import Node
    except ImportError:
        return None

    class LeanHeadNode(Node):
        """Ray's head node without the dashboard's API server (see the module docstring)."""

        def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
            self._webui_url = None

    return LeanHeadNode


def start_local_head(
    num_cpus: int, temp_dir: str | None = None, log_monitor: bool = True, startup_concurrency: int | None = None
) -> Any | None:
    """Start a local head node of ``num_cpus`` CPUs; returns it (its ``address`` is what
    ``ray.init`` joins), or None where this Ray has no such private API.

    ``startup_concurrency``: how many worker processes the raylet starts at once (Ray's
    ``worker_maximum_startup_concurrency``; its default is ``num_cpus``). An explicit
    ``RAY_worker_maximum_startup_concurrency`` in the environment wins."""
    node_class = _lean_node_class()
    if node_class is None:
        return None
    try:
        from ray._private.parameter import RayParams

        params = RayParams(
            num_cpus=num_cpus,
            include_dashboard=False,
            no_monitor=True,
            # Ray annotates this Optional[str], yet reads it as a flag (its docstring: "If True")
            include_log_monitor=log_monitor,  # type: ignore[arg-type]
            temp_dir=temp_dir,
            _system_config=_system_config(startup_concurrency),
        )
    except (ImportError, TypeError) as exc:  # a Ray whose private parameters moved
        logger.warning("starting Ray the usual way (no lean local head on this Ray: %s)", exc)
        return None
    with _dashboard_dependencies_found_without_importing():
        node = node_class(params, head=True, shutdown_at_exit=False, spawn_reaper=True, ray_init_cluster=True)
    # Ray registered its own exit hook when it was imported, so this one runs first (exit hooks
    # run last-registered first): it disconnects the driver itself, then stops the node's
    # processes, what ``ray.shutdown`` does for a node it started; Ray's hook then finds
    # nothing left to do.
    atexit.register(stop_local_head, node)
    _HEADS.append(node)
    watchdog = _watch_agents(node)
    if watchdog is not None:
        _WATCHDOGS.append(watchdog)  # its pipe must stay open as long as this process lives
    return node


DASHBOARD_DEPENDENCIES = (
    "aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry", "opentelemetry.exporter.prometheus",
    "opentelemetry.proto", "prometheus_client", "pydantic",
)  # fmt: skip
"""What ``ray.dashboard.optional_deps`` imports (Ray's test of a ``ray[default]`` install)."""


@contextlib.contextmanager
def _dashboard_dependencies_found_without_importing() -> Iterator[None]:
    """While the node starts, Ray's test of whether the dashboard's dependencies are installed
    (it picks the raylet's agent flags) looks for them instead of importing them all: 1-2 ms
    against 0.8 s of CPU in the driver, on the cores the node's processes start on. The answer
    is the same where the packages import (``ray[default]`` is a dependency of rl-train)."""
    import ray._private.utils as ray_utils

    original = getattr(ray_utils, "get_dashboard_dependency_error", None)
    if original is None:  # a Ray without this test: nothing to replace
        yield
        return

    def looked_up() -> ImportError | None:
        missing = [name for name in DASHBOARD_DEPENDENCIES if _find_spec(name) is None]
        return ImportError(f"not installed: {', '.join(missing)}") if missing else None

    ray_utils.get_dashboard_dependency_error = looked_up
    try:
        yield
    finally:
        ray_utils.get_dashboard_dependency_error = original


def _find_spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


_HEADS: list[Any] = []
_WATCHDOGS: list[subprocess.Popen[bytes]] = []


def _system_config(startup_concurrency: int | None) -> dict[str, Any]:
    if startup_concurrency is None or "RAY_worker_maximum_startup_concurrency" in os.environ:
        return {}
    return {"worker_maximum_startup_concurrency": startup_concurrency}


def stop_local_head(node: Any) -> None:
    """Disconnect this process from Ray and stop the node's processes (idempotent)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if node in _HEADS:
        _HEADS.remove(node)
        node.destroy_external_storage()
    node.kill_all_processes(check_alive=False, allow_graceful=True)


def stop_local_heads() -> None:
    """Stop every head this process started (a test session's teardown)."""
    for node in list(_HEADS):
        stop_local_head(node)


WATCHDOG = """
import json, os, signal, sys
targets = json.loads(sys.argv[1])
sys.stdin.buffer.read()  # returns at end-of-file: the driver is gone
for pid, started in targets:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            if stat.read().rsplit(")", 1)[1].split()[19] == started:
                os.kill(pid, signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""
"""The agents' watchdog (see the module docstring); it imports nothing but the standard library."""


def _watch_agents(node: Any) -> subprocess.Popen[bytes] | None:
    """Start the watchdog over the raylet's children (its agents; Linux only, else nothing).

    The raylet registers with the GCS (which the node's start waits for) only once its agents
    have reported their ports, so by now they are its children."""
    if not sys.platform.startswith("linux"):
        return None
    from ray._private import ray_constants

    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
    targets = [
        [pid, fields[19]]
        for raylet in raylets
        for pid in proc_children(raylet.process.pid)
        if (fields := proc_stat_fields(pid)) is not None
    ]
    if not targets:
        return None
    # The pipe's write end stays open in this process (never written): the watchdog's read
    # returns when this process has ended, whichever way. Its own session keeps it out of a
    # Ctrl-C meant for the run.
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, json.dumps(targets)], stdin=subprocess.PIPE, start_new_session=True
    )
