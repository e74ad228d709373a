"""Registries are explicit tables: nothing registers itself on import, no name list is kept
beside a table, and every table can be read (names checked, listed, described) without
importing the heavy implementations it names."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
from import_probe import imported_after

from rl_train.config import ConfigError, describe_fields, load_config
from rl_train.registry import REGISTRIES, Entry, Registry, UnknownNameError, describe_registries, registries

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "rl_train"
PLUGIN = "rl_train_registry_plugin_under_test"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[tuple[str, ast.Module]]:
    return [(_module_name(p), ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def _is_registry_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Registry"


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module ``PLUGIN`` (not imported yet) with a documented function ``grade``."""
    (tmp_path / f"{PLUGIN}.py").write_text('def grade():\n    """Grades.\n\n    More detail."""\n    return 1.0\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    importlib.invalidate_caches()
    return PLUGIN


def test_an_unknown_name_lists_the_table_and_is_a_key_and_a_value_error() -> None:
    registry = Registry("reward function", "data_source", {"exact": Entry(len, "exact"), "arith": Entry(abs, "a")})
    with pytest.raises(UnknownNameError, match=r"^unknown reward function 'exakt'; available: arith, exact$"):
        registry["exakt"]
    with pytest.raises(KeyError):
        registry.get("exakt")
    with pytest.raises(ValueError, match="available: arith, exact"):  # what a pydantic validator needs
        registry.check("exakt")
    assert registry.check("exact") == "exact" and registry.get("arith") is abs


def test_a_table_is_fixed_once_built_and_keeps_its_order() -> None:
    table = {"b": Entry(len, "b"), "a": Entry(abs, "a")}
    registry = Registry("thing", "x.y", table)
    table["c"] = Entry(min, "c")
    assert "c" not in registry and len(registry) == 2
    assert list(registry) == ["b", "a"] and registry.names() == ["a", "b"]


def test_a_lazy_entry_is_imported_only_when_its_implementation_is_asked_for(plugin: str) -> None:
    registry: Registry[Entry[object]] = Registry("grader", "x.y", {"mine": Entry(f"{plugin}:grade")})
    assert "mine" in registry and registry.check("mine") == "mine" and registry["mine"].module == plugin
    assert plugin not in sys.modules  # checking and listing a name imported nothing
    assert registry.describe() == {"mine": "Grades."}  # the docstring's first paragraph
    assert registry.get("mine")() == 1.0


def test_a_wrong_import_path_names_itself(plugin: str) -> None:
    registry: Registry[Entry[object]] = Registry("grader", "x.y", {"typo": Entry(f"{plugin}:grdae")})
    with pytest.raises(ImportError, match=f"'{plugin}:grdae': module '{plugin}' has no attribute 'grdae'"):
        registry.get("typo")


def test_the_list_of_registries_is_every_registry_in_the_package() -> None:
    """``REGISTRIES`` (what ``describe_registries`` covers) is exactly the module-level
    ``Registry(...)`` tables found in the source."""
    found = {
        f"{module}:{node.targets[0].id if isinstance(node, ast.Assign) else node.target.id}"  # type: ignore[union-attr]
        for module, tree in _sources()
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and _is_registry_call(node.value)
    }
    assert found == set(REGISTRIES)


def test_no_table_names_one_key_twice() -> None:
    """A dict literal keeps the last of two equal keys silently: one name, two implementations."""
    twice = []
    for module, tree in _sources():
        for node in ast.walk(tree):
            if _is_registry_call(node) and isinstance(table := node.args[-1], ast.Dict):  # type: ignore[attr-defined]
                keys = [k.value for k in table.keys if isinstance(k, ast.Constant)]
                twice += [f"{module}: {k!r}" for k in set(keys) if keys.count(k) > 1]
    assert not twice


NOT_REGISTRIES = {"atexit.register", "register_buffer", "register_forward_hook", "register_memory"}
"""The standard library's, torch's and Mooncake's own calls of that name."""


def _called(node: ast.Call) -> str:
    """``f`` of ``f(...)``; ``atexit.register`` of ``atexit.register(...)``; else the attribute."""
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "atexit":
        return f"atexit.{func.attr}"
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_nothing_is_registered_by_a_decorator_or_a_register_call() -> None:
    registering = [
        f"{module}:{node.lineno}"
        for module, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called(node).startswith(("register", "atexit.register"))
        and _called(node) not in NOT_REGISTRIES
    ]
    assert not registering, f"registration calls at {registering}: add to the table instead"


CHOSEN_ON_PURPOSE = {
    "rl_train.bench.training_engines": "compares torch with megatron, each by name",
    "rl_train.bench.gateway_agents": "compares an in-process agent with a process one, each by name",
}
"""Modules whose list of names is a choice that happens to be every name today, not a copy."""


def test_no_module_keeps_a_copy_of_a_registrys_names() -> None:
    """A tuple, list or set of string literals, a ``Literal[...]`` or the keys of a dict (other than
    a table's own) that hold every name of a registry are a second list that drifts from the
    table: derive it from the registry instead."""
    tables = {kind: frozenset(registry) for kind, registry in registries().items() if len(registry) > 1}
    copies = []
    for module, tree in _sources():
        if module in CHOSEN_ON_PURPOSE:
            continue
        tables_here = {id(node.args[-1]) for node in ast.walk(tree) if _is_registry_call(node)}  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            if id(node) in tables_here:
                continue
            strings = frozenset(
                e.value for e in _elements(node) if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
            copies += [f"{module}:{node.lineno}: the {kind} names" for kind, names in tables.items() if strings == names]
    assert not copies, copies


def _elements(node: ast.AST) -> list[ast.expr | None]:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return list(node.elts)
    if isinstance(node, ast.Dict):
        return list(node.keys)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        return node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return []


def test_every_entry_loads_and_says_what_it_does() -> None:
    described = describe_registries()
    assert set(described) == set(registries())
    for kind, registry in registries().items():
        assert list(described[kind]) == registry.names()
        assert all(text.strip() and "\n" not in text for text in described[kind].values()), kind
        for name in registry:
            entry = registry[name]
            if isinstance(entry, Entry):  # its import path resolves, to what lives where it says
                loaded = entry.load()
                home = loaded.__name__ if isinstance(loaded, ModuleType) else loaded.__module__
                assert home == entry.module, (kind, name)


def test_reading_every_registry_imports_no_heavy_module() -> None:
    statement = (
        "from rl_train.registry import registries; "
        "[(r.names(), [r[n] for n in r], r.chosen_by) for r in registries().values()]"
    )
    heavy = ("torch", "transformers", "ray", "prefect", "sglang", "megatron", "rl_train.flows")
    assert imported_after(statement, heavy) == []


UNCHECKED_AT_LOAD = {"data.builtin_task": "looked up when the task's files are written, at the run's start"}


def _config_keys() -> list[tuple[str, str]]:
    """(registry kind, config key) for every leaf field that holds one registry name."""
    leaves = {path for path, default, _ in describe_fields() if default == "None" or default.startswith("'")}
    return [
        (kind, key)
        for kind, registry in registries().items()
        for key in (part.strip() for part in registry.chosen_by.split(","))
        if key in leaves and key not in UNCHECKED_AT_LOAD
    ]


@pytest.mark.parametrize(("kind", "key"), _config_keys(), ids=lambda value: value)
def test_an_unknown_name_in_a_config_fails_at_load_naming_path_value_and_names(kind: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=not_a_name"])
    message = str(info.value)
    assert f"{key}: " in message and "'not_a_name'" in message, message
    assert f"available: {', '.join(registries()[kind].names())}" in message, message


def test_the_load_check_covers_every_registry_a_config_names() -> None:
    fields = {path for path, _, _ in describe_fields()}
    named_in_config = {
        kind for kind, r in registries().items() if any(key.strip() in fields for key in r.chosen_by.split(","))
    }
    assert named_in_config - {kind for kind, _ in _config_keys()} == {"built-in task"}
