"""A named actor passed to a constructor by name rather than by handle.

Ray keeps an actor handle given as a constructor argument in its object store. An actor that
Ray may restart (``max_restarts``) then logs an error-level warning at every start: its restart
fails if that object is ever lost. A name and a namespace are plain data, inlined with the call,
and resolve afresh each time the actor is constructed, restarts included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray


@dataclass(frozen=True)
class NamedActor:
    name: str
    namespace: str

    def resolve(self) -> Any:
        return ray.get_actor(self.name, namespace=self.namespace)


def resolve_actor(ref: Any) -> Any:
    """The handle of ``ref``: a ``NamedActor`` is looked up, anything else is a handle already."""
    return ref.resolve() if isinstance(ref, NamedActor) else ref
