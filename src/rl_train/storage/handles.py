"""Calling a storage or worker object the same way whether it is a Ray actor or a plain object.

The replay buffers talk to the TransferQueue and the rollout replicas through these two
functions, so unit tests drive them with a plain ``TransferQueue`` and no Ray.
"""

from __future__ import annotations

from typing import Any

import ray


def submit(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Start ``method``: a Ray object reference for an actor, the result itself for a plain object."""
    bound = getattr(handle, method)
    remote = getattr(bound, "remote", None)
    return remote(*args, **kwargs) if remote is not None else bound(*args, **kwargs)


def wait_all(pending: list[Any]) -> list[Any]:
    """Results of ``submit`` calls, in order."""
    return [ray.get(p) if isinstance(p, ray.ObjectRef) else p for p in pending]


def call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``method`` and wait for its result."""
    return wait_all([submit(handle, method, *args, **kwargs)])[0]


def cast(handle: Any, method: str, *args: Any, **kwargs: Any) -> None:
    """Call ``method`` without waiting (a Ray actor runs it in submission order for this caller)."""
    submit(handle, method, *args, **kwargs)
