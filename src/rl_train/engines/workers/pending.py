"""A Ray actor call in flight, and the handle type of the run's actors.

Ray types an actor handle's methods as ``Never`` (``ActorHandle.__getattr__``): a checker then
takes every line after an actor call for unreachable. The run's actors are therefore held as
``Actor`` (untyped), and the typed clients and pools around them (``queue_client``,
``rollout_pool``, ``trainer_pool``, ...) are the contract: each actor method the driver calls is
one method there, with its arguments and result typed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeAlias, TypeVar

import ray

T = TypeVar("T")
Actor: TypeAlias = Any
"""A Ray actor handle (see the module docstring)."""


class RayPending(Generic[T]):
    """storage's ``Pending`` for an actor call: ``wait`` returns its result or raises its error."""

    def __init__(self, ref: ray.ObjectRef[T]) -> None:
        self.ref = ref

    def wait(self) -> T:
        result: T = ray.get(self.ref)
        return result


def wait_all(pending: Sequence[RayPending[T]]) -> list[T]:
    """The results of ``pending``, in order (one ``ray.get`` for all of them)."""
    results: list[T] = ray.get([p.ref for p in pending])
    return results
