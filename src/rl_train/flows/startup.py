"""Start-up in parallel: Ray, Prefect's API and the heavy imports come up side by side.

A run needs three slow things before its first step, and none of them waits on another:
Ray (its head processes), Prefect's temporary API server when no ``PREFECT_API_URL`` is set
(a subprocess that takes seconds to answer), and the imports of torch, transformers and the
flow and worker modules (CPU in this process). Started one after the other they add up.

``warm_start`` first launches Prefect's temporary API server (when the run uses Prefect and
no server is configured: ``flows/prefect_api.py``, which does not import Prefect to do so),
then starts Ray in the calling (main) thread, which Ray requires for its signal handlers,
while a helper thread does the imports and then waits for the API to answer. Ray mostly
waits on its own processes, and Prefect's server is a process of its own too, so the three
overlap even on two cores. The helper is joined before returning, and an error it met is
raised here.

This module imports neither torch nor Prefect nor the workers: that is its point.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rl_train import startup_clock
from rl_train.flows.registry import trainer_modules

HEAVY_MODULES = ("rl_train.flows.train", *trainer_modules())
"""What a training run imports anyway: the trainer modes' classes (``rl_train.modes``), the
pools, every worker class and torch with them (about 1.2 s on the main thread after Ray
came up, when the modes were imported at the first lookup of one)."""


@dataclass
class StartupTimes:
    """Seconds from ``warm_start``'s call until each part was ready (for the start-up bench)."""

    ray: float = 0.0
    prefect: float | None = None
    imports: float = 0.0
    total: float = 0.0


def needs_temporary_prefect_api(use_prefect: bool) -> bool:
    """Whether this process would start Prefect's throwaway API (no server configured)."""
    if not use_prefect or os.environ.get("PREFECT_API_URL"):  # the user's server, or ours already up
        return False
    return os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "true").lower() not in ("0", "false", "no")


def warm_start(
    ray_address: str | None,
    ray_num_cpus: int | None,
    use_prefect: bool,
    num_actors: int = 0,
    after_ray: Callable[[], object] | None = None,
) -> StartupTimes:
    """Bring up Ray, Prefect's API (if this run starts one) and the heavy imports together
    (``num_actors``: what ``ensure_ray`` is told of the run's actors). ``after_ray`` runs in
    this thread once Ray is up and the imports are done, while Prefect's API may still be
    coming up (``rl-train train`` asks Ray for the run's actors there: ``flows/prelaunch.py``)."""
    started = time.perf_counter()
    times = StartupTimes()
    errors: list[BaseException] = []
    imported = threading.Event()
    api = None
    if needs_temporary_prefect_api(use_prefect):
        from rl_train.flows.prefect_api import TemporaryPrefectAPI

        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        api = TemporaryPrefectAPI(timeout)
        api.start()  # in this (main) thread: the server lives as long as it

    def helper() -> None:
        try:
            for name in HEAVY_MODULES:
                importlib.import_module(name)
            times.imports = time.perf_counter() - started
            startup_clock.mark("imports")
            imported.set()
            if api is not None:
                api.wait_ready()
                times.prefect = time.perf_counter() - started
                startup_clock.mark("prefect_api")
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
        finally:
            imported.set()

    thread = threading.Thread(target=helper, name="rl-train-warm-start", daemon=True)
    thread.start()
    from rl_train.engines.workers.ray_start import ensure_ray

    try:
        ensure_ray(ray_address, ray_num_cpus, num_actors)
        times.ray = time.perf_counter() - started
        startup_clock.mark("ray")
        imported.wait()
        if after_ray is not None and not errors:
            after_ray()
    finally:
        thread.join()
    if errors:
        raise errors[0]
    times.total = time.perf_counter() - started
    return times
