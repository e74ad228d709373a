"""Starting Ray (or joining a cluster), kept free of torch and the workers' imports so that a
process can start Ray first and import the heavy modules while Ray comes up."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray

from rl_train.engines.workers.local_ray_head import (
    LOOPBACK,
    is_loopback_address,
    loopback_addresses,
    start_local_head,
)
from rl_train.runtime import default_ray_auth_mode

LEAN_HEAD = os.environ.get("RL_TRAIN_RAY_LEAN_HEAD", "1") not in ("0", "false", "no")
"""A local Ray starts as ``local_ray_head.start_local_head`` does (without the dashboard's API
server and the autoscaler's monitor); ``RL_TRAIN_RAY_LEAN_HEAD=0`` starts it as a plain
``ray.init()`` does (the start-up bench measures one against the other)."""


def _settle_auth_mode() -> None:
    """Set ``RAY_AUTH_MODE`` where unset (``default_ray_auth_mode``) and make this process's Ray
    follow it: Ray reads the mode into its config when it is imported, which may be before the
    mode was set here; it is then re-read, as Ray itself does when it turns token auth on
    (else this process would ask its own token-guarded head without the token)."""
    default_ray_auth_mode()
    try:
        from ray._raylet import (  # type: ignore[attr-defined]  # compiled, without stubs for these
            AuthenticationMode,
            AuthenticationTokenLoader,
            Config,
            get_authentication_mode,
        )
    except ImportError:  # a Ray without token authentication: nothing to follow
        return
    wanted = os.environ["RAY_AUTH_MODE"].lower() == "token"
    if (get_authentication_mode() == AuthenticationMode.TOKEN) != wanted:
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def ensure_ray(address: str | None, num_cpus: int | None, num_actors: int = 0) -> None:
    """Start a local Ray (or join ``address``) once per process. Never attaches to "auto".

    A local Ray listens on loopback only. Ray's token authentication is on where the
    environment says so (``RAY_AUTH_MODE=token``), or holds a token (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``; see ``runtime.default_ray_auth_mode``): the process then joins a
    cluster with that token, and a local Ray it starts asks for it of every client, its own
    workers included (they inherit the environment).

    ``num_actors``: how many actors the run creates at its start. A local Ray starts that many
    worker processes at once rather than one per CPU (Ray's default): the run's actors reserve
    no CPU and spend their start importing, so on two cores the rollout replica no longer waits
    for the trainer's and the queue's processes to come up before its own starts."""
    if ray.is_initialized():
        return
    _settle_auth_mode()
    # Ray starts workers at nice 15; the actors *are* the compute here, so without this the
    # driver's bookkeeping (Prefect's API server among it) preempts the training itself.
    os.environ.setdefault("RAY_worker_niceness", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING"}
    if address:
        if address == "auto":
            raise ValueError("ray.address 'auto' could attach to a foreign cluster; give an explicit address")
        with loopback_addresses() if is_loopback_address(address) else contextlib.nullcontext():
            ray.init(address=address, **kwargs)
        return
    temp_dir = os.environ.get("RL_TRAIN_RAY_TMPDIR") or None
    cpus = num_cpus or os.cpu_count() or 1
    head = start_local_head(cpus, temp_dir, startup_concurrency=max(cpus, num_actors)) if LEAN_HEAD else None
    with loopback_addresses():
        if head is not None:
            ray.init(address=head.address, **kwargs)
            return
        if temp_dir:
            kwargs["_temp_dir"] = temp_dir
        ray.init(num_cpus=cpus, _node_ip_address=LOOPBACK, **kwargs)
