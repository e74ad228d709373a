"""Name -> object registries filled by decorators.

Every pluggable piece (trainer modes, advantage estimators, policy losses, weight-sync
backends, reward functions) is chosen once, at build time, from a registry by the name in
the config. Nothing on the hot path branches on a config string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A config named something no one registered; the message lists what is registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry(Generic[T]):
    """A named table of implementations of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` (and aliases).

        Registering a name twice for two different objects raises ``ValueError``;
        re-registering the same object (a module imported twice) is a no-op.
        """

        def decorate(obj: T) -> T:
            for key in (name, *aliases):
                existing = self._items.get(key)
                if existing is not None and existing is not obj and _qualname(existing) != _qualname(obj):
                    raise ValueError(
                        f"{self.kind} {key!r} is already registered to {_qualname(existing)}; "
                        f"cannot register {_qualname(obj)} under the same name"
                    )
                self._items[key] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        """The object registered under ``name``; an unknown name lists the available ones."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; available: {', '.join(sorted(self._items)) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def _qualname(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"
