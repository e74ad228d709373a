"""The type check (``scripts/typecheck.sh``, mypy as ``pyproject.toml`` configures it) covers the
whole package and silences none of its own code where it matters.

mypy fails on any error, so what could hollow the check out is its configuration: a narrowed
``files``, a module let off its errors, a first-party import allowed to stay unresolved. The
flows, the tasks, storage and every module that declares a ``Protocol`` (the contracts) are
never let off, whatever else may be.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy itself depends on tomli below 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rl_train"
NEVER_LET_OFF = ("rl_train.flows", "rl_train.tasks", "rl_train.storage")
SILENCING = ("ignore_errors", "disable_error_code", "follow_imports", "ignore_missing_imports")


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def protocol_modules() -> list[str]:
    """Modules that define a class deriving from ``Protocol`` (``typing.Protocol`` included)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(
            isinstance(node, ast.ClassDef) and any(ast.unparse(base).split(".")[-1] == "Protocol" for base in node.bases)
            for node in ast.walk(tree)
        ):
            found.append(_module_name(path))
    return found


def _applies(pattern: str, package: str) -> bool:
    """Whether a mypy override's ``module`` pattern (``a.b``, ``a.b.*``, ``a.*.c``) applies to the
    module ``package`` or to any module under it."""
    prefix = pattern.removesuffix(".*")
    return (
        prefix == package
        or prefix.startswith(f"{package}.")
        or (pattern.endswith(".*") and package.startswith(f"{prefix}."))
        or fnmatch.fnmatchcase(package, pattern)
    )


def test_mypy_is_pinned_and_checks_the_whole_package() -> None:
    config = _pyproject()
    assert any(re.fullmatch(r"mypy==\d+(\.\d+)+", dep) for dep in config["project"]["optional-dependencies"]["test"])
    mypy = config["tool"]["mypy"]
    assert mypy["files"] == ["src/rl_train"]
    assert not set(mypy) & {*SILENCING, "exclude"}, "a global setting would let every module off"


def test_no_override_lets_first_party_code_off() -> None:
    """Third-party packages without types may be listed by name; no rl_train module's imports may
    be left unresolved, and flows, tasks, storage and the Protocol modules keep every error."""
    contracts = protocol_modules()
    assert "rl_train.engines.weight_sync.base" in contracts  # the scan finds the Protocols
    problems = []
    for override in _pyproject()["tool"]["mypy"].get("overrides", []):
        patterns = override["module"] if isinstance(override["module"], list) else [override["module"]]
        silenced = [key for key in SILENCING if override.get(key)]
        for pattern in patterns if silenced else ():
            if pattern.startswith("rl_train") and {"ignore_missing_imports", "follow_imports"} & set(silenced):
                problems.append(f"{pattern}: first-party imports must resolve ({silenced})")
            let_off = [m for m in (*NEVER_LET_OFF, *contracts) if _applies(pattern, m)]
            if let_off:
                problems.append(f"{pattern} ({silenced}) lets off {let_off}")
    assert not problems, "\n".join(problems)


def test_the_script_runs_mypy_over_the_configured_files() -> None:
    """No paths on the script's command line: mypy checks ``files`` from the configuration."""
    script = (ROOT / "scripts" / "typecheck.sh").read_text(encoding="utf-8")
    runs = [line for line in script.splitlines() if "bin/mypy" in line and not line.lstrip().startswith("#")]
    assert runs and all("src/" not in line for line in runs), runs
    assert "set -euo pipefail" in script
