"""How a run's actor errors are told apart: a run that is gone, and an error a retry may pass."""

from __future__ import annotations

import ray


class RunGoneError(RuntimeError):
    """The run's actors cannot be reached from this process (the run ended, or another cluster)."""


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,  # died (and may be restarting) or unavailable for a moment
    ray.exceptions.GetTimeoutError,
    ConnectionError,
    TimeoutError,
)


def find_cause(exc: BaseException, types: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc`` or the first error in its chain of causes that is one of ``types``, also when it
    was raised inside an actor's task (a ``RayTaskError`` carries the remote exception)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, types):
            return current
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else current.__cause__
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether an error may pass on a second try: a worker that died and is being restarted, a
    timeout, a dropped connection, also when it surfaced inside another actor's task."""
    return find_cause(exc, TRANSIENT_ERRORS) is not None
