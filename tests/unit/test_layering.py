"""Dependencies point one way: flows -> tasks -> engines / storage (STYLE.md, rule 1).

Parses imports (without running them) and checks that no lower layer imports a higher one,
that GPU-only packages are imported only inside functions (lazily), that flows and tasks
drive Ray only through the pools' typed methods, and that loading a config starts nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "rl_train"
LAYERS = {"flows": 3, "deployments": 4, "tasks": 2, "engines": 1, "storage": 1}
GPU_ONLY = ("sglang", "megatron", "mooncake", "vllm")
CORE = {"rl_train.algorithms", "rl_train.registry"}
"""Pure code: the algorithms and the registry import nothing of the layers."""
CONFIG_LEVEL = ("config.py", "modes.py", "runtime.py", "registry.py")
"""rl_train/ modules below the flows: they may read engine and storage configs, nothing above."""


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
        for path in (PACKAGE / folder).rglob("*.py"):
            for module, _ in _imports(path):
                parts = module.split(".")
                if parts[0] == "rl_train" and len(parts) > 1 and LAYERS.get(parts[1], 0) > level:
                    problems.append(f"{path.relative_to(REPO)} imports {module}")
    assert not problems, "\n".join(problems)


def test_gpu_only_packages_are_imported_lazily() -> None:
    problems = []
    for path in PACKAGE.rglob("*.py"):
        for module, at_top in _imports(path):
            if at_top and module.split(".")[0].startswith(GPU_ONLY):
                problems.append(f"{path.relative_to(REPO)} imports {module} at module level")
    assert not problems, "\n".join(problems)


def test_rl_train_core_sits_below_the_layers() -> None:
    """rl_train.algorithms and the registry are pure; the config modules sit below tasks and flows."""
    problems = []
    for path in (PACKAGE / "algorithms").rglob("*.py"):
        for module, _ in _imports(path):
            parts = module.split(".")
            if parts[0] == "rl_train" and ".".join(parts[:2]) not in CORE:
                problems.append(f"{path.relative_to(REPO)} imports {module}")
    for name in CONFIG_LEVEL:
        for module, _ in _imports(PACKAGE / name):
            parts = module.split(".")
            if parts[0] == "rl_train" and len(parts) > 1 and LAYERS.get(parts[1], 0) > 1:
                problems.append(f"rl_train/{name} imports {module}")
    assert not problems, "\n".join(problems)


def test_flows_and_tasks_never_import_ray() -> None:
    """They call typed methods on the pools (engines/workers/pools.py), never actors by name."""
    problems = [
        f"{path.relative_to(REPO)} imports {module}"
        for folder in ("flows", "tasks", "deployments")
        for path in (PACKAGE / folder).rglob("*.py")
        for module, _ in _imports(path)
        if module.split(".")[0] == "ray"
    ]
    assert not problems, "\n".join(problems)


def test_loading_a_config_imports_neither_ray_prefect_nor_flows() -> None:
    code = (
        "import sys; from rl_train.config import load_config; "
        "load_config(sys.argv[1], ['trainer.mode=colocate_async']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'prefect') "
        "or m.startswith(('rl_train.flows', 'rl_train.tasks'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "configs" / "arith-tiny.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout[-2000:]
