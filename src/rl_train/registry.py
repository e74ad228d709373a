"""Name -> implementation tables: every piece a config (or a data row) chooses by name.

Trainer modes, advantage estimators, policy losses, engines, weight-sync backends, agent
loops, tools, reward functions... are each chosen once, at build time, from a registry by
the name in the config; nothing on the hot path branches on a config string.

A registry is one dict literal in the module that owns what it names, wrapped in a
``Registry`` where it is written. Nothing registers itself by being imported, and no name
list is kept beside a table: whatever needs the names (config validation, error messages,
``describe_registries``) asks the table. Each entry carries its implementation, either
the object itself or an import path ``"package.module:attr"`` imported at first use, so that
a table can be read (names checked at config load) without importing torch or a heavy
backend; and its one-line description, written in the table or taken from the
implementation's docstring.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

T = TypeVar("T")


class Described(Protocol):
    """What every registry entry has: one line for users (error messages, docs)."""

    @property
    def description(self) -> str: ...


E = TypeVar("E", bound=Described, covariant=True)


class UnknownNameError(KeyError, ValueError):
    """A config named something no registry holds; the message lists what it holds.

    A ``KeyError`` for lookups, and a ``ValueError`` so that a pydantic validator that
    calls ``Registry.check`` reports it under the field's dotted path."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def resolve(path: str) -> Any:
    """``"package.module:attr"`` -> the attribute (``"package.module"`` -> the module)."""
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{path!r}: module {module_name!r} has no attribute {attr!r}") from None


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered implementation: the object, or the import path of one, and what it does."""

    target: T | str
    """The implementation, or ``"package.module:attr"`` naming it (imported by ``load``)."""
    summary: str = ""
    """One line for users; empty: the first paragraph of the implementation's docstring."""

    def load(self) -> T:
        if isinstance(self.target, str):
            return cast(T, resolve(self.target))
        return self.target

    @property
    def module(self) -> str:
        """The module that defines the implementation, known without importing it."""
        if isinstance(self.target, str):
            return self.target.partition(":")[0]
        return self.target.__module__

    @property
    def description(self) -> str:
        """``summary``, else the implementation's docstring summary (importing it)."""
        if self.summary:
            return self.summary
        doc = self.load().__doc__ or ""
        return " ".join(doc.strip().split("\n\n", 1)[0].split())


class Registry(Generic[E]):
    """One explicit table: name -> entry, read-only once built.

    ``kind`` names what it holds in messages ("unknown policy loss 'x'; available: ...");
    ``chosen_by`` says where a user picks a name (a config key, a data column), for docs."""

    def __init__(self, kind: str, chosen_by: str, table: Mapping[str, E]) -> None:
        self.kind = kind
        self.chosen_by = chosen_by
        self._table: dict[str, E] = dict(table)

    def __getitem__(self, name: str) -> E:
        """The entry of ``name``; an unknown name lists the available ones."""
        if name not in self._table:
            raise self._unknown(name)
        return self._table[name]

    def get(self: Registry[Entry[T]], name: str) -> T:
        """The implementation registered as ``name`` (imported now if the table names its path)."""
        return self[name].load()

    def check(self, name: str) -> str:
        """``name`` if registered, else ``UnknownNameError`` (a ``ValueError``): a pydantic
        validator, so that an unknown name fails at config load under its dotted path."""
        if name not in self._table:
            raise self._unknown(name)
        return name

    def names(self) -> list[str]:
        """The names, sorted (error messages and docs list them so)."""
        return sorted(self._table)

    def describe(self) -> dict[str, str]:
        """Name -> the entry's one-line description, in name order."""
        return {name: self._table[name].description for name in self.names()}

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[str]:
        """The names in the table's order, as written (``names()`` sorts them)."""
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def _unknown(self, name: object) -> UnknownNameError:
        return UnknownNameError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names()) or '(none)'}")


REGISTRIES = (
    "rl_train.modes:MODES",
    "rl_train.algorithms.advantage:ADV_ESTIMATORS",
    "rl_train.algorithms.policy_loss:POLICY_LOSSES",
    "rl_train.algorithms.kl:KL_ESTIMATORS",
    "rl_train.algorithms.aggregation:AGGREGATORS",
    "rl_train.algorithms.config:ROLLOUT_CORRECTION_PRESETS",
    "rl_train.algorithms.thresholds:RS_OPTIONS",
    "rl_train.engines.training.registry:TRAINING_ENGINES",
    "rl_train.engines.training.router_replay_modes:ROUTER_REPLAYS",
    "rl_train.engines.rollout.registry:ROLLOUT_ENGINES",
    "rl_train.engines.weight_sync.backends:WEIGHT_SYNC_BACKENDS",
    "rl_train.engines.weight_sync.transports:TRANSPORTS",
    "rl_train.engines.agent.registry:AGENT_LOOPS",
    "rl_train.engines.agent.tools:TOOLS",
    "rl_train.engines.agent.gateway_modes:GATEWAY_MODES",
    "rl_train.engines.rollout.tool_env:TOOL_ENVS",
    "rl_train.engines.reward.registry:REWARDS",
    "rl_train.engines.reward.gar_graders:GROUP_GRADERS",
    "rl_train.storage.builtin_data:BUILTIN_TASKS",
)
"""Where every registry lives (``tests/unit/test_registry.py`` finds each ``Registry(...)`` in
the package and holds this to them). Importing them imports no torch."""


def registries() -> dict[str, Registry[Described]]:
    """Every registry, by its ``kind`` (each knows its ``chosen_by`` and its entries)."""
    found = [cast(Registry[Described], resolve(path)) for path in REGISTRIES]
    return {registry.kind: registry for registry in found}


def describe_registries() -> dict[str, dict[str, str]]:
    """``{kind: {name: one-line description}}`` of every registry, names sorted: what a user
    can name in a config or a data row, for the reference docs. It imports the
    implementations whose description is their docstring (torch, for the algorithms)."""
    return {kind: registry.describe() for kind, registry in registries().items()}
