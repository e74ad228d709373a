"""Process-wide defaults for Prefect and Ray, applied by the CLI and benches before either
is imported. Every one is a ``setdefault``: a user's own environment always wins."""

from __future__ import annotations

import os

QUIET = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "RAY_worker_niceness": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # The throwaway API server can take well over its default 20 s to start on a loaded 2-core box.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # Prefect's server keeps CSRF protection off unless told otherwise; a client that supports it
    # still asks for a token each time it opens a connection (one more request per step sub-flow).
    "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "false",
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
# The task-run recorder writes each task-run event in a transaction of its own (about 30 per
# global step). On SQLite every such write holds the database's one write lock, and the step
# sub-flow's own API calls then wait for it (measured: a sub-flow with 9 task runs, 590 ms
# against 155 ms empty). Batched, the recorder writes a step's task runs in one or two
# transactions (257 ms); the UI shows a task run's state at most a second later.
EPHEMERAL_SERVER |= {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


RAY_TOKEN_SOURCES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Where Ray reads a cluster's auth token from the environment (else ``~/.ray/auth_token``)."""


def default_ray_auth_mode() -> None:
    """``RAY_AUTH_MODE``, unless set: ``token`` where the environment holds a token for Ray
    (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``), so that a process given a cluster's token
    joins it with the token, and so do the Ray processes it starts; otherwise ``disabled`` (a
    local head listens on loopback only, and a Ray of 2.5x left to itself would write a token
    to ``~/.ray``)."""
    token_given = any(os.environ.get(name) for name in RAY_TOKEN_SOURCES)
    os.environ.setdefault("RAY_AUTH_MODE", "token" if token_given else "disabled")


def apply_local_defaults() -> None:
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    default_ray_auth_mode()
    if not os.environ.get("PREFECT_API_URL"):
        for key, value in EPHEMERAL_SERVER.items():
            os.environ.setdefault(key, value)
