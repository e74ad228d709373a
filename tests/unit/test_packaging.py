"""The build config ships every Python folder of the tree, and applies without deprecations.

A hand-kept package list once left ``engines.{model,reward,rollout,training,workers}`` out of
the wheel; editable installs resolve modules from the tree and hid it. These tests read what
setuptools itself resolves from ``setup.py`` + ``pyproject.toml`` (``.ci/run`` also builds and
installs the real wheel).
"""

from __future__ import annotations

import runpy
import warnings
from pathlib import Path
from typing import Any

import pytest
import setuptools
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[2]

NOT_SHIPPED = {"tests"}
"""Top-level folders holding Python files that are deliberately not part of the package."""

BUILD_OUTPUT = ("build", "dist", "__pycache__")


def _setup_arguments(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``setup.py`` passes to ``setup()`` (nothing when the tree has no setup.py)."""
    captured: dict[str, Any] = {}
    if (ROOT / "setup.py").exists():
        with monkeypatch.context() as patch:
            patch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
            runpy.run_path(str(ROOT / "setup.py"))
    return captured


def _resolved_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Distribution, list[warnings.WarningMessage]]:
    """The distribution as a build configures it (setup() arguments, then pyproject.toml),
    and the warnings that raised."""
    monkeypatch.chdir(ROOT)  # pyproject.toml is read from the working directory
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = Distribution(_setup_arguments(monkeypatch))
        dist.parse_config_files()
    return dist, caught


def _python_folders() -> set[Path]:
    """Every folder of the tree (relative to the root) that holds a ``.py`` file."""
    folders = set()
    for path in ROOT.rglob("*.py"):
        rel = path.parent.relative_to(ROOT)
        if not rel.parts or rel.parts[0] in NOT_SHIPPED:
            continue
        if any(p.startswith(".") or p in BUILD_OUTPUT or p.endswith(".egg-info") for p in rel.parts):
            continue
        folders.add(rel)
    return folders


def test_every_python_folder_is_a_package_of_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    dist, _ = _resolved_distribution(monkeypatch)
    folder_to_package = {Path(folder): package for package, folder in dist.package_dir.items()}
    expected = set()
    for folder in _python_folders():
        top = Path(folder.parts[0])
        assert top in folder_to_package, (
            f"{folder} holds Python files but no package maps {top}/ (setup.py PACKAGE_DIRS), "
            f"and it is not listed as not shipped"
        )
        expected.add(".".join((folder_to_package[top], *folder.parts[1:])))
    shipped = set(dist.packages)
    assert not expected - shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert not shipped - expected, f"packages without a folder of Python files: {sorted(shipped - expected)}"
    # the subpackages a hand-kept list once dropped
    assert {"rl_train.engines.model", "rl_train.engines.workers", "rl_train.engines.rollout"} <= shipped


def test_build_config_applies_without_deprecation_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    _, caught = _resolved_distribution(monkeypatch)
    deprecations = [str(w.message).splitlines()[0] for w in caught if "deprecat" in str(w.message).lower()]
    assert not deprecations, deprecations
