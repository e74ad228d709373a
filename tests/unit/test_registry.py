"""Registry name clashes: a different object under a taken name is refused, unless it is the
same definition brought back by a fresh import of its module."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from rl_train.registry import Registry

PLUGIN_CLASS = """
@REGISTRY.register("plugin")
class PluginLoss:
    pass
"""
PLUGIN = "from registry_holder import REGISTRY\n" + PLUGIN_CLASS


def _make_reward() -> Callable[[], float]:
    def reward() -> float:  # each call makes a new function with one and the same qualname
        return 1.0

    return reward


@pytest.fixture
def plugin_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry[type]:
    """A registry in an importable module, and a plugin module on sys.path that registers into it."""
    registry: Registry[type] = Registry("policy loss")
    holder = types.ModuleType("registry_holder")
    holder.REGISTRY = registry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "registry_holder", holder)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rl_train_plugin_under_test", raising=False)
    return registry


def _write_plugin(tmp_path: Path, source: str) -> None:
    (tmp_path / "rl_train_plugin_under_test.py").write_text(source)
    importlib.invalidate_caches()


def test_same_object_twice_and_aliases_are_a_no_op() -> None:
    registry: Registry[Callable[[], float]] = Registry("reward function")
    reward = _make_reward()
    registry.register("exact", "alias")(reward)
    registry.register("exact")(reward)
    assert registry.get("exact") is reward and registry.get("alias") is reward


def test_a_different_object_with_the_same_qualname_is_refused() -> None:
    registry: Registry[Callable[[], float]] = Registry("reward function")
    first, second = _make_reward(), _make_reward()
    assert first.__qualname__ == second.__qualname__ and first.__module__ == second.__module__
    registry.register("exact")(first)
    with pytest.raises(ValueError, match="already registered.*same qualified name"):
        registry.register("exact")(second)
    assert registry.get("exact") is first


def test_a_refused_alias_leaves_every_name_unchanged() -> None:
    registry: Registry[Callable[[], float]] = Registry("reward function")
    first, second = _make_reward(), _make_reward()
    registry.register("taken")(first)
    with pytest.raises(ValueError):
        registry.register("fresh", "taken")(second)
    assert "fresh" not in registry and registry.get("taken") is first


def test_a_second_definition_in_one_module_is_refused(
    tmp_path: Path, plugin_registry: Registry[type]
) -> None:
    _write_plugin(tmp_path, PLUGIN + PLUGIN_CLASS)  # the class defined twice
    with pytest.raises(ValueError, match="policy loss 'plugin' is already registered"):
        importlib.import_module("rl_train_plugin_under_test")


def test_a_fresh_import_of_the_module_replaces_its_own_definition(
    tmp_path: Path, plugin_registry: Registry[type]
) -> None:
    _write_plugin(tmp_path, PLUGIN)
    first = importlib.import_module("rl_train_plugin_under_test")
    del sys.modules["rl_train_plugin_under_test"]
    second = importlib.import_module("rl_train_plugin_under_test")
    assert second is not first and second.PluginLoss is not first.PluginLoss
    assert plugin_registry.get("plugin") is second.PluginLoss


def test_plain_values_are_the_same_when_equal() -> None:
    registry: Registry[tuple[str, str]] = Registry("weight-sync transport")
    registry.register("tcp")(("pkg.tcp", ""))
    registry.register("tcp")(("pkg.tcp", ""))  # an equal value: the same registration
    with pytest.raises(ValueError, match="already registered"):
        registry.register("tcp")(("pkg.other", ""))
    assert registry.get("tcp") == ("pkg.tcp", "")
