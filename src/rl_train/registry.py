"""Name -> object registries filled by decorators.

Every pluggable piece (trainer modes, advantage estimators, policy losses, weight-sync
backends, reward functions) is chosen once, at build time, from a registry by the name in
the config. Nothing on the hot path branches on a config string.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import ModuleType
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
        self._modules: dict[str, ModuleType | None] = {}
        """Name -> the module object that defined the registered object, when it was registered."""

    @classmethod
    def from_table(cls, kind: str, table: dict[str, T]) -> Registry[T]:
        """A registry filled from an explicit ``{name: implementation}`` table.

        The built-in registries are built this way, in the module that imports every
        implementation, so implementation modules never import their registry back (no
        import cycles, no registration by import side effect). Users still ``register``."""
        registry = cls(kind)
        for name, obj in table.items():
            registry.register(name)(obj)
        return registry

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` (and aliases).

        A taken name raises ``ValueError`` unless the new object is the registered one, or
        the same definition from a re-import (see ``_is_reimport``); two different objects
        that only share a qualified name (a second definition in one module, or one made
        in a function) are refused, never silently swapped.
        """

        def decorate(obj: T) -> T:
            keys = (name, *aliases)
            for key in keys:  # check every key first: a refusal leaves the table unchanged
                if key in self._items and not self._may_replace(key, obj):
                    existing = _describe(self._items[key])
                    twin = (
                        " (a different object with the same qualified name: a second definition, "
                        "or one made inside a function)"
                        if existing == _describe(obj)
                        else ""
                    )
                    raise ValueError(
                        f"{self.kind} {key!r} is already registered to {existing}; "
                        f"cannot register {_describe(obj)}{twin} under the same name"
                    )
            module = sys.modules.get(getattr(obj, "__module__", None) or "")
            for key in keys:
                self._items[key] = obj
                self._modules[key] = module
            return obj

        return decorate

    def _may_replace(self, key: str, obj: T) -> bool:
        existing = self._items[key]
        if existing is obj:
            return True
        if not hasattr(obj, "__qualname__") and not hasattr(existing, "__qualname__"):
            return bool(existing == obj)  # plain values (a module path, a tuple): equal is the same
        return _is_reimport(existing, self._modules[key], obj)

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


def _is_reimport(existing: object, existing_module: ModuleType | None, obj: object) -> bool:
    """``obj`` is ``existing``'s definition executed again by a fresh import of its module.

    That is the case when both carry the same module and qualified name and the module
    object that defined ``existing`` is no longer the one in ``sys.modules`` (the module was
    removed and imported anew). While the defining module is still the imported one, a
    second object of that name is a different definition. ``importlib.reload`` re-executes
    the same module object, so it cannot be told apart from a second definition and is refused.
    """
    if _describe(existing) != _describe(obj) or existing_module is None:
        return False
    return sys.modules.get(getattr(obj, "__module__", "")) is not existing_module


def _describe(obj: object) -> str:
    """``module.qualname`` of a function or class; the repr of a plain value."""
    if not hasattr(obj, "__qualname__"):
        return repr(obj)
    return f"{getattr(obj, '__module__', '?')}.{obj.__qualname__}"
