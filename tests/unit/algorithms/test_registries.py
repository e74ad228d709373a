"""The algorithm registries are explicit tables, and every algorithm module can be imported first.

Before, each implementation module imported its registry to register itself and the registry
module imported the implementations back at its bottom; importing ``advantage_outcome``
first then failed on the cycle. Now one module per registry holds the table, naming each
implementation by import path; no implementation module imports a registry.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ALGORITHMS = Path(__file__).resolve().parents[3] / "src" / "rl_train" / "algorithms"
MODULES = sorted(f"rl_train.algorithms.{p.stem}" for p in ALGORITHMS.glob("*.py") if p.stem != "__init__")

IMPORT_EACH_FIRST = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith("rl_train")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
"""


def test_every_algorithm_module_can_be_imported_first() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, *MODULES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout


@pytest.mark.parametrize("path", sorted(ALGORITHMS.glob("*.py")), ids=lambda p: p.name)
def test_no_algorithm_registers_itself_by_import_side_effect(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    registering = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for decorator in node.decorator_list
        if isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr in ("register", "requires")
    ]
    first_definition = min(
        (n.lineno for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)), default=10**9
    )
    late_imports = [
        node.lineno
        for node in tree.body
        if isinstance(node, ast.ImportFrom | ast.Import) and node.lineno > first_definition
    ]
    assert not registering, f"{path.name}: registration decorators at lines {registering}; add to the table"
    assert not late_imports, f"{path.name}: imports at lines {late_imports} (after definitions: a cycle?)"
