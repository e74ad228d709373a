"""Dependencies point one way: flows -> tasks -> engines / storage (STYLE.md, rule 1).

Parses imports (without running them) and checks that no lower layer imports a higher one,
and that GPU-only packages are imported only inside functions (lazily).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"flows": 3, "deployments": 4, "tasks": 2, "engines": 1, "storage": 1}
GPU_ONLY = ("sglang", "megatron", "mooncake", "vllm")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module top level) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, id(node) in top))
    return found


def test_lower_layers_never_import_higher_ones() -> None:
    problems = []
    for folder, level in LAYERS.items():
        for path in (REPO / folder).rglob("*.py"):
            for module, _ in _imports(path):
                parts = module.split(".")
                if parts[0] == "rl_train" and len(parts) > 1 and LAYERS.get(parts[1], 0) > level:
                    problems.append(f"{path.relative_to(REPO)} imports {module}")
    assert not problems, "\n".join(problems)


def test_gpu_only_packages_are_imported_lazily() -> None:
    problems = []
    for folder in (*LAYERS, "rl_train"):
        for path in (REPO / folder).rglob("*.py"):
            for module, at_top in _imports(path):
                if at_top and module.split(".")[0].startswith(GPU_ONLY):
                    problems.append(f"{path.relative_to(REPO)} imports {module} at module level")
    assert not problems, "\n".join(problems)
