"""Build script: the package list is derived from the tree, never kept by hand.

The top-level folders install under the ``rl_train`` namespace (``flows/`` becomes
``rl_train.flows``) so that a user's own ``tasks.py`` or ``flows/`` can neither shadow them
nor be shadowed by them. setuptools' ``[tool.setuptools.packages.find]`` finds packages by
their folder names and cannot place a folder under another package, so this file walks each
mapped folder and lists every folder below it that holds a ``.py`` file. A hand-kept list
once left five subpackages out of the wheel, which editable installs hid.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent

PACKAGE_DIRS = {
    "rl_train": "rl_train",
    "rl_train.flows": "flows",
    "rl_train.tasks": "tasks",
    "rl_train.engines": "engines",
    "rl_train.storage": "storage",
    "rl_train.deployments": "deployments",
    "rl_train.bench": "bench",
    "rl_train.examples": "examples",
}
"""Package name -> the repository folder it installs from."""


def find_packages_in(package: str, folder: Path) -> list[str]:
    """``package`` and its subpackages: every folder under ``folder`` holding a ``.py`` file."""
    found = []
    for directory in sorted({path.parent for path in folder.rglob("*.py")}):
        parts = directory.relative_to(folder).parts
        if "__pycache__" not in parts:
            found.append(".".join((package, *parts)))
    return found


def find_packages() -> list[str]:
    return sorted(
        name for package, folder in PACKAGE_DIRS.items() for name in find_packages_in(package, ROOT / folder)
    )


setup(packages=find_packages(), package_dir=PACKAGE_DIRS)
