"""Dependencies point one way: flows -> tasks -> engines -> storage (STYLE.md, rule 1).

Parses imports (without running them) and checks that every folder and top-level module of
rl_train has a rank and imports only lower ranks, that the algorithms are pure, that GPU-only
packages are imported only inside functions (lazily), that flows and tasks drive Ray only
through the pools' typed methods, and that loading a config starts nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "rl_train"

RANKS = {
    "__init__.py": 0,
    "registry.py": 0,
    "child_process.py": 0,
    "runtime.py": 0,
    "owned_tmp.py": 0,
    "startup_clock.py": 1,
    "algorithms": 1,
    "storage": 2,
    "engines": 3,
    "modes.py": 4,
    "config.py": 5,
    "tasks": 6,
    "flows": 7,
    "deployments": 8,
    "cli.py": 9,
    "reference_names.py": 9,
    "reference_doc.py": 10,
    "bench": 10,
    "examples": 10,
}
"""Every folder and top-level module of ``rl_train`` and its rank: a unit imports only units of a
lower rank (its own modules aside). Leaves first: the registry, process helpers and the pure
algorithms; storage (records, checkpoints, the replay buffers) below the engines, which read
and write it (a worker restores its engine from a ``CheckpointStore``; storage is handed what
it needs of an engine, such as the reward routing, by its caller); the config tree above the
engines and storage whose configs it gathers; then tasks, flows, deployments, the CLI and the
generator of docs/reference.md (which reads the config tree and every registry). The
benchmarks and examples sit on top: they may import anything, and nothing imports them."""

TYPE_ONLY_UPWARD = {
    ("modes.py", "config.py"): "a mode's hooks are typed with the Config they edit",
    ("engines", "config.py"): "the worker pools are launched from the run's whole Config, read by type only",
}
"""Imports against the ranks allowed only under ``if TYPE_CHECKING:`` (no import at run time);
config.py imports ``MODES`` at run time, so modes.py sits below it."""

GPU_ONLY = ("sglang", "megatron", "mooncake", "vllm")
CORE = {"rl_train.algorithms", "rl_train.registry"}
"""Pure code: the algorithms import nothing of rl_train but themselves and the registry."""
SANDBOX_ALLOWED = ("rl_train.engines.sandbox", "rl_train.algorithms.config")
"""The sandbox (``engines/sandbox``) is a leaf among the engines: it imports nothing of rl_train
but itself and the config base, and its shim (run by path inside the sandbox, under ``-I``)
imports nothing of rl_train at all."""


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str
    at_top: bool
    """At module level (not inside a function or class)."""
    type_only: bool
    """Under ``if TYPE_CHECKING:``."""


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found.update(id(inner) for child in node.body for inner in ast.walk(child))
    return found


def _imports(path: Path, root: Path = PACKAGE) -> list[Import]:
    """Every import in ``path`` (a file under the package folder ``root``), relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top, type_only = {id(node) for node in tree.body}, _type_checking_nodes(tree)
    package = [root.name, *path.relative_to(root).parent.parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            # ``from rl_train import flows`` imports the unit ``flows``
            modules = [f"{module}.{alias.name}" for alias in node.names] if module == root.name else [module]
        else:
            continue
        found += [Import(path, node.lineno, m, id(node) in top, id(node) in type_only) for m in modules]
    return found


def _unit(module_or_path: str | Path, root: Path) -> str | None:
    """The ranked unit a module name or a file under ``root`` belongs to (None: not rl_train)."""
    if isinstance(module_or_path, Path):
        return module_or_path.relative_to(root).parts[0]
    parts = module_or_path.split(".")
    if parts[0] != root.name or len(parts) < 2:
        return None
    return parts[1] if (root / parts[1]).is_dir() else f"{parts[1]}.py"


def unranked_units(root: Path, ranks: dict[str, int]) -> list[str]:
    """Folders with Python code and top-level modules under ``root`` missing from ``ranks``,
    and ranked names that no longer exist."""
    present = {p.name for p in root.iterdir() if p.suffix == ".py"} | {
        p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))
    }
    return [f"{name}: no rank in RANKS" for name in sorted(present - set(ranks))] + [
        f"{name}: ranked but not in {root.name}/" for name in sorted(set(ranks) - present)
    ]


def rank_violations(
    root: Path, ranks: dict[str, int], type_only_upward: dict[tuple[str, str], str]
) -> tuple[list[str], set[tuple[str, str]]]:
    """Imports of a unit of the same or a higher rank, and the ``type_only_upward`` pairs used."""
    problems, used = [], set()
    for path in sorted(root.rglob("*.py")):
        source = _unit(path, root)
        for imp in _imports(path, root):
            target = _unit(imp.module, root)
            if target is None or target == source or not {source, target} <= set(ranks):  # unranked: see above
                continue
            if ranks[target] < ranks[source]:  # down the ranks
                continue
            if imp.type_only and (source, target) in type_only_upward:
                used.add((source, target))
                continue
            problems.append(
                f"{path.relative_to(root.parent)}:{imp.line}: {source} (rank {ranks[source]}) imports "
                f"{imp.module} ({target}, rank {ranks[target]})"
            )
    return problems, used


def test_every_folder_and_module_has_a_rank() -> None:
    """A new folder or top-level module must be placed in RANKS before it can be imported."""
    problems = unranked_units(PACKAGE, RANKS)
    assert not problems, "\n".join(problems)


def test_imports_point_down_the_ranks() -> None:
    problems, used = rank_violations(PACKAGE, RANKS, TYPE_ONLY_UPWARD)
    assert not problems, "\n".join(problems)
    assert used == set(TYPE_ONLY_UPWARD), f"type-only exceptions no import needs: {set(TYPE_ONLY_UPWARD) - used}"


def test_the_checks_catch_an_upward_import_and_an_unranked_folder(tmp_path: Path) -> None:
    """The two checks above on a made-up package: storage importing engines at run time (and
    relatively), an allowed type-only import, and a folder that has no rank."""
    root = tmp_path / "rl_train"
    for name, text in {
        "storage/__init__.py": "",
        "storage/buffer.py": "from rl_train.engines.pool import Pool\n",
        "engines/__init__.py": "",
        "engines/pool.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rl_train.flows import x\n",
        "engines/sub/lazy.py": "def f():\n    from ...storage import buffer\n    from ...flows.step import g\n",
        "flows/step.py": "from rl_train import engines, storage\n",
        "plugins/extra.py": "",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    ranks = {"storage": 2, "engines": 3, "flows": 7}
    assert unranked_units(root, ranks) == ["plugins: no rank in RANKS"]
    problems, used = rank_violations(root, ranks, {("engines", "flows"): "typed only"})
    assert [p.split(": ", 1)[1] for p in problems] == [
        "engines (rank 3) imports rl_train.flows.step (flows, rank 7)",
        "storage (rank 2) imports rl_train.engines.pool (engines, rank 3)",
    ]
    assert used == {("engines", "flows")}


def test_algorithms_are_pure() -> None:
    """rl_train.algorithms imports nothing of rl_train but itself and the registry."""
    problems = [
        f"{imp.path.relative_to(REPO)}:{imp.line} imports {imp.module}"
        for path in (PACKAGE / "algorithms").rglob("*.py")
        for imp in _imports(path)
        if imp.module.split(".")[0] == "rl_train" and ".".join(imp.module.split(".")[:2]) not in CORE
    ]
    assert not problems, "\n".join(problems)


def test_the_sandbox_is_a_leaf_and_its_shim_stands_alone() -> None:
    sandbox = PACKAGE / "engines" / "sandbox"
    problems = [
        f"{imp.path.relative_to(REPO)}:{imp.line} imports {imp.module}"
        for path in sandbox.rglob("*.py")
        for imp in _imports(path)
        if imp.module.split(".")[0] == "rl_train" and (path.name == "shim.py" or not imp.module.startswith(SANDBOX_ALLOWED))
    ]
    assert sandbox.is_dir() and not problems, "\n".join(problems)


def test_gpu_only_packages_are_imported_lazily() -> None:
    problems = [
        f"{imp.path.relative_to(REPO)}:{imp.line} imports {imp.module} at module level"
        for path in PACKAGE.rglob("*.py")
        for imp in _imports(path)
        if imp.at_top and imp.module.split(".")[0].startswith(GPU_ONLY)
    ]
    assert not problems, "\n".join(problems)


def test_flows_and_tasks_never_import_ray() -> None:
    """They call typed methods on the pools (engines/workers/pools.py), never actors by name."""
    problems = [
        f"{imp.path.relative_to(REPO)}:{imp.line} imports {imp.module}"
        for folder in ("flows", "tasks", "deployments")
        for path in (PACKAGE / folder).rglob("*.py")
        for imp in _imports(path)
        if imp.module.split(".")[0] == "ray"
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
