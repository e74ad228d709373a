"""Actors are called through typed methods, never by method-name strings (STYLE.md).

An AST scan of src/rl_train flags the three shapes such a call takes:

- ``getattr(handle, name).remote(...)`` (or ``.options``): the method picked by a string;
- ``getattr(x, "remote", None)``: a helper probing whether a handle is an actor, the core of a
  "call this method by name on whatever it is" helper;
- a call that passes an actor method's name as a string literal into a parameter that ends
  up as ``getattr``'s attribute name (``call(tq, "put", ...)``, ``each_rollout("sleep")``),
  however many helpers it is forwarded through.

The scanner is first run on the shapes that the code once had, so that it is shown to catch them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "rl_train"
WORKERS = {
    "engines/workers/trainer_worker.py": "TrainerWorker",
    "engines/workers/rollout_worker.py": "RolloutWorker",
    "engines/workers/reward_worker.py": "RewardWorker",
    "engines/workers/critic_worker.py": "CriticWorker",
    "engines/workers/queue_worker.py": "QueueWorker",
    "storage/transfer_queue.py": "TransferQueue",
}
"""The actor classes (the queue actor's base included): their public methods are the names."""


def actor_method_names() -> set[str]:
    names: set[str] = set()
    for path, class_name in WORKERS.items():
        tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                names |= {
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
                }
    return names


def _is_getattr(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"


def _callee(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _dispatchers(tree: ast.Module) -> dict[str, set[int]]:
    """function name -> positions of its parameters that end up as ``getattr``'s attribute
    name, directly or through another such function (to a fixed point)."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    found: dict[str, set[int]] = {}
    changed = True
    while changed:
        changed = False
        for function in functions:
            params = [a.arg for a in function.args.args]
            offset = 1 if params and params[0] in ("self", "cls") else 0
            for node in ast.walk(function):
                if not isinstance(node, ast.Call):
                    continue
                if _is_getattr(node) and len(node.args) > 1:
                    targets = [node.args[1]]
                else:
                    positions = found.get(_callee(node) or "", set())
                    targets = [arg for i, arg in enumerate(node.args) if i in positions]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in params:
                        position = params.index(target.id) - offset
                        if position not in found.setdefault(function.name, set()):
                            found[function.name].add(position)
                            changed = True
    return found


def method_name_calls(source: str, actor_methods: set[str], dispatchers: dict[str, set[int]]) -> Iterator[str]:
    """Each place in ``source`` that calls an actor method by its name (see the module docstring)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("remote", "options") and _is_getattr(node.value):
            yield f"line {node.lineno}: getattr(...).{node.attr}"
        if not isinstance(node, ast.Call):
            continue
        if _is_getattr(node) and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value == "remote":
                yield f"line {node.lineno}: getattr(..., 'remote') probes for an actor"
        for i in dispatchers.get(_callee(node) or "", set()):
            if i < len(node.args):
                arg = node.args[i]
                if isinstance(arg, ast.Constant) and arg.value in actor_methods:
                    yield f"line {node.lineno}: {_callee(node)}(..., {arg.value!r}) calls an actor method by name"


def scan(sources: dict[str, str]) -> list[str]:
    """Every method-name call in ``sources`` (name -> code); dispatchers are found across all."""
    dispatchers: dict[str, set[int]] = {}
    for source in sources.values():
        for name, positions in _dispatchers(ast.parse(source)).items():
            dispatchers.setdefault(name, set()).update(positions)
    methods = actor_method_names()
    return [f"{name} {hit}" for name, source in sources.items() for hit in method_name_calls(source, methods, dispatchers)]


OLD_HANDLES = '''
def submit(handle, method, *args, **kwargs):
    bound = getattr(handle, method)
    remote = getattr(bound, "remote", None)
    return remote(*args, **kwargs) if remote is not None else bound(*args, **kwargs)

def call(handle, method, *args, **kwargs):
    return wait_all([submit(handle, method, *args, **kwargs)])[0]
'''
OLD_BUFFER = '''
def release(self, batch_id):
    batch = call(self.tq, "get_batch", batch_id, ["groups"])
    call(self.tq, "delete", PARTITION, batch["groups"])
'''
OLD_ROLLOUT_CONTROL = '''
class RolloutControl:
    def _each_rollout(self, method, *args):
        return list(ray.get([getattr(r, method).remote(*args) for r in self.rollouts]))

    def sleep_rollouts(self):
        self._each_rollout("sleep")

    def _on_each_rollout(self, method, missing_ok):
        if not missing_ok:
            self._each_rollout(method)
'''


def test_the_scan_catches_the_shapes_the_code_once_had() -> None:
    hits = scan({"handles": OLD_HANDLES, "buffer": OLD_BUFFER, "control": OLD_ROLLOUT_CONTROL})
    assert "handles line 4: getattr(..., 'remote') probes for an actor" in hits
    assert "buffer line 3: call(..., 'get_batch') calls an actor method by name" in hits
    assert "buffer line 4: call(..., 'delete') calls an actor method by name" in hits
    assert "control line 4: getattr(...).remote" in hits
    assert "control line 7: _each_rollout(..., 'sleep') calls an actor method by name" in hits
    # a plain string argument is no actor call: only actor method names through a dispatcher count
    assert scan({"ok": 'def f(tq):\n    return call(tq, "train")\n' + OLD_HANDLES}) == [
        "ok line 6: getattr(..., 'remote') probes for an actor"
    ]


def test_no_actor_is_called_by_a_method_name_string() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    hits = scan(sources)
    assert not hits, "call actors through typed methods (engines/workers/*_pool.py):\n" + "\n".join(hits)


def test_the_actor_method_names_are_read_from_the_workers() -> None:
    methods = actor_method_names()
    assert {"generate_prompts", "enqueue", "score", "update", "put", "get_batch", "send_weights"} <= methods
