"""The build ships every Python folder under ``src/``, with the folder path as the module path.

A hand-kept package list once left ``engines.{model,reward,rollout,training,workers}`` out of
the wheel, and a folder mapping once made 825 first-party imports name paths that did not
exist on disk. Now the package lives in ``src/rl_train`` and setuptools finds it there: these
tests read what setuptools itself resolves from ``pyproject.toml`` (``.ci/run`` also builds and
installs the real wheel).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

BUILD_OUTPUT = ("build", "dist", "__pycache__")


def _resolved_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Distribution, list[warnings.WarningMessage]]:
    """The distribution as a build configures it from ``pyproject.toml``, and the warnings raised."""
    monkeypatch.chdir(ROOT)  # pyproject.toml is read from the working directory
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = Distribution()
        dist.parse_config_files()
    return dist, caught


def _python_folders() -> set[str]:
    """Every folder under ``src/`` that holds a ``.py`` file, as a dotted module path."""
    folders = set()
    for path in SRC.rglob("*.py"):
        rel = path.parent.relative_to(SRC)
        if any(p.startswith(".") or p in BUILD_OUTPUT or p.endswith(".egg-info") for p in rel.parts):
            continue
        folders.add(".".join(rel.parts))
    return folders


def test_no_python_outside_src_but_tests() -> None:
    """Only ``tests/`` holds Python outside the package: nothing needs a folder mapping."""
    stray = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.glob("*/**/*.py")
        if path.relative_to(ROOT).parts[0] not in ("src", "tests")
        and not path.relative_to(ROOT).parts[0].startswith(".")
        and path.relative_to(ROOT).parts[0] not in BUILD_OUTPUT
    )
    stray += sorted(p.name for p in ROOT.glob("*.py"))
    assert not stray, f"Python files outside src/ and tests/: {stray}"


def test_every_python_folder_is_a_package_of_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    dist, _ = _resolved_distribution(monkeypatch)
    assert dist.package_dir in ({"": "src"}, None, {}), f"a folder mapping crept back: {dist.package_dir}"
    shipped = set(dist.packages or ())
    expected = _python_folders()
    assert expected == shipped, (sorted(expected - shipped), sorted(shipped - expected))
    # the subpackages a hand-kept list once dropped
    assert {"rl_train.engines.model", "rl_train.engines.workers", "rl_train.engines.rollout"} <= shipped


def test_the_package_imports_from_its_own_folder() -> None:
    """``rl_train.flows`` is ``src/rl_train/flows``: tools that follow an import find the file."""
    import rl_train.engines.workers.pools as pools
    import rl_train.flows.step as step

    assert Path(step.__file__).resolve() == SRC / "rl_train" / "flows" / "step.py"
    assert Path(pools.__file__).resolve() == SRC / "rl_train" / "engines" / "workers" / "pools.py"


def test_build_config_applies_without_deprecation_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    _, caught = _resolved_distribution(monkeypatch)
    deprecations = [str(w.message).splitlines()[0] for w in caught if "deprecat" in str(w.message).lower()]
    assert not deprecations, deprecations
