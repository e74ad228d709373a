"""Process-wide defaults for Prefect and Ray, applied by the CLI and benches before either
is imported. Every one is a ``setdefault``: a user's own environment always wins."""

from __future__ import annotations

import os

QUIET = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "RAY_AUTH_MODE": "disabled",
    "RAY_worker_niceness": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # The throwaway API server can take well over its default 20 s to start on a loaded 2-core box.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}

# With no PREFECT_API_URL, Prefect starts a temporary local server for this process. Its
# background services (scheduler, late runs, foreman, triggers...) serve deployments and
# automations that such a throwaway server never has; on a 2-core machine they only take CPU
# from training. Run recording (events, task runs) stays on, so the runs are still visible.
EPHEMERAL_SERVER = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in (
        "SCHEDULER",
        "LATE_RUNS",
        "FOREMAN",
        "CANCELLATION_CLEANUP",
        "PAUSE_EXPIRATIONS",
        "REPOSSESSOR",
        "CLEANUP_RECONCILER",
        "TRIGGERS",
    )
}


def apply_local_defaults() -> None:
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PREFECT_API_URL"):
        for key, value in EPHEMERAL_SERVER.items():
            os.environ.setdefault(key, value)
