"""The engine Protocols list everything the workers use: a worker reaching past one fails here.

The check reads the workers' source (``engines/workers/*.py`` and the router-replay strategy):
every name bound with a Protocol annotation (``self.engine: TrainingEngine``, a parameter
``engine: RolloutEngine``, a property returning one) is followed to its uses, and each use must
be a member the Protocol declares, called with keyword arguments the member declares, and never
probed (``getattr`` / ``hasattr`` on it). mypy checks the same from the types; this keeps it
true in a checkout where mypy is not run, and keeps engines from being typed ``Any``.
"""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rl_train.engines.rollout.protocol import RolloutEngine
from rl_train.engines.training.critic_protocol import ValueEngine
from rl_train.engines.training.protocol import TrainingEngine
from rl_train.engines.training.router_replay import RouterReplay

SRC = Path(__file__).resolve().parents[2] / "src" / "rl_train" / "engines"
PROTOCOLS: dict[str, type] = {p.__name__: p for p in (TrainingEngine, RolloutEngine, ValueEngine, RouterReplay)}
MODULES = sorted((SRC / "workers").glob("*.py")) + [SRC / "training" / "router_replay.py"]
PROBES = {"getattr", "hasattr", "setattr", "delattr"}


def members(protocol: type) -> set[str]:
    """The public names a Protocol declares: methods, properties and annotated attributes."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object, typing.Protocol, typing.Generic):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")}
        names |= {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}
    return names


def _protocol_in(annotation: ast.expr | None) -> str | None:
    """The Protocol an annotation names (``P``, ``P | None``, ``"P"``), or None."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    found = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name) and n.id in PROTOCOLS}
    return found.pop() if len(found) == 1 else None


@dataclass
class Report:
    """What the check found in one module."""

    used: set[str] = field(default_factory=set)
    """``Protocol.member`` for every use that passed."""
    problems: list[str] = field(default_factory=list)


def _bind(bound: dict[str, str], key: str, protocol: str | None, line: int, problems: list[str]) -> None:
    if protocol is not None and bound.setdefault(key, protocol) != protocol:
        problems.append(f"line {line}: {key} is annotated both {bound[key]} and {protocol}")


def _name_bindings(tree: ast.AST, problems: list[str]) -> dict[str, str]:
    """Plain names annotated with a Protocol: parameters and annotated locals (module-wide)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            _bind(bound, node.target.id, _protocol_in(node.annotation), node.lineno, problems)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                _bind(bound, arg.arg, _protocol_in(arg.annotation), node.lineno, problems)
    return bound


def _self_bindings(cls: ast.ClassDef, problems: list[str]) -> dict[str, str]:
    """A class's ``self.attr`` annotated with a Protocol, and its properties returning one."""
    bound: dict[str, str] = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.AnnAssign):
            target = node.target
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                _bind(bound, f"self.{target.attr}", _protocol_in(node.annotation), node.lineno, problems)
        elif isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            _bind(bound, f"self.{node.name}", _protocol_in(node.returns), node.lineno, problems)
    return bound


def _classes(tree: ast.AST) -> list[ast.ClassDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def class_bindings(sources: list[str]) -> dict[str, dict[str, str]]:
    """Every class of ``sources`` by name -> its own ``self.attr`` bindings (for subclasses)."""
    return {cls.name: _self_bindings(cls, []) for source in sources for cls in _classes(ast.parse(source))}


def _inherited(cls: ast.ClassDef, known: dict[str, dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in known:
            out.update(known[base.id])
    return out


def _key(expr: ast.expr, typed: dict[str, type]) -> str | None:
    """``name`` or ``self.attr`` when ``expr`` is one of the Protocol-typed ones in ``typed``."""
    key = None
    if isinstance(expr, ast.Name):
        key = expr.id
    elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        key = f"self.{expr.attr}"
    return key if key in typed else None


def _check_attribute(node: ast.Attribute, typed: dict[str, type], report: Report) -> None:
    key = _key(node.value, typed)
    if key is None:
        return
    protocol = typed[key]
    if node.attr in members(protocol):
        report.used.add(f"{protocol.__name__}.{node.attr}")
    else:
        report.problems.append(f"line {node.lineno}: {key}.{node.attr} is not a member of {protocol.__name__}")


def _check_call(node: ast.Call, typed: dict[str, type], report: Report) -> None:
    func = node.func
    if isinstance(func, ast.Name) and func.id in PROBES and node.args:
        key = _key(node.args[0], typed)
        if key is not None:
            report.problems.append(f"line {node.lineno}: {func.id}({key}, ...) probes a {typed[key].__name__}")
    if not isinstance(func, ast.Attribute) or (key := _key(func.value, typed)) is None:
        return
    member = getattr(typed[key], func.attr, None)
    if not callable(member):
        return
    accepted = inspect.signature(member).parameters
    for keyword in node.keywords:
        if keyword.arg is not None and keyword.arg not in accepted:
            report.problems.append(f"line {node.lineno}: {typed[key].__name__}.{func.attr} declares no keyword {keyword.arg!r}")


def _check_uses(scope: ast.AST, typed: dict[str, type], report: Report, skip: set[int]) -> None:
    for node in ast.walk(scope):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Attribute):
            _check_attribute(node, typed, report)
        elif isinstance(node, ast.Call):
            _check_call(node, typed, report)


def check_source(source: str, known: dict[str, dict[str, str]] | None = None) -> Report:
    """Every use of a Protocol-typed name in ``source`` against what its Protocol declares;
    ``known``: other modules' classes, whose ``self`` bindings a subclass here inherits."""
    tree = ast.parse(source)
    report = Report()
    names = _name_bindings(tree, report.problems)
    in_classes: set[int] = set()
    for cls in _classes(tree):
        own = {**_inherited(cls, known or {}), **_self_bindings(cls, report.problems)}
        typed = {key: PROTOCOLS[name] for key, name in {**names, **own}.items()}
        _check_uses(cls, typed, report, in_classes)
        in_classes |= {id(node) for node in ast.walk(cls)}
    _check_uses(tree, {key: PROTOCOLS[name] for key, name in names.items()}, report, in_classes)
    return report


KNOWN = class_bindings([path.read_text() for path in MODULES])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_workers_use_only_what_the_engine_protocols_declare(path: Path) -> None:
    report = check_source(path.read_text(), KNOWN)
    assert report.problems == [], "\n".join(f"{path.name}: {p}" for p in report.problems)


def test_the_check_follows_each_worker_to_its_engines() -> None:
    """Not vacuous: the workers' engine calls are among the uses it checked."""
    used = {path.stem: check_source(path.read_text(), KNOWN).used for path in MODULES}
    assert {
        "TrainingEngine.compute_log_probs",
        "TrainingEngine.train_batch",
        "TrainingEngine.export_weights",
        "TrainingEngine.data_parallel_rank",
        "RolloutEngine.update_weights",
        "RouterReplay.old_log_probs",
        "RouterReplay.update_metrics",
    } <= used["trainer_worker"]
    assert {"ValueEngine.compute_values", "ValueEngine.train_batch", "ValueEngine.load_state_dict"} <= used["critic_worker"]
    assert {"RolloutEngine.sampling_state", "RolloutEngine.close", "RolloutEngine.version"} <= used["rollout_worker"]
    assert {"RolloutEngine.kv_reused_tokens", "RolloutEngine.generate"} <= used["turn_taking"]
    assert {"TrainingEngine.compute_log_probs", "TrainingEngine.replays_routes"} <= used["router_replay"]
    assert {f"RolloutEngine.{m}" for m in members(RolloutEngine)} <= used["engine_wrapper"]


def test_the_check_catches_an_undeclared_member_keyword_or_probe() -> None:
    source = '''
class Worker:
    def __init__(self) -> None:
        self.engine: TrainingEngine | None = None

    def step(self, engine: RolloutEngine) -> None:
        self.engine.forward_backward_batch(batch)
        self.engine.compute_log_probs(batch, pi_old=True, stream=True)
        engine.generate(requests, params)
        getattr(self.engine, "data_parallel_rank", 0)
'''
    problems = check_source(source).problems
    assert len(problems) == 3, problems
    for expected in (
        "line 7: self.engine.forward_backward_batch is not a member of TrainingEngine",
        "line 8: TrainingEngine.compute_log_probs declares no keyword 'stream'",
        "line 10: getattr(self.engine, ...) probes a TrainingEngine",
    ):
        assert expected in problems, problems


def test_a_subclass_is_held_to_the_protocol_its_base_binds() -> None:
    base = "class Wrapper:\n    def __init__(self, engine: RolloutEngine) -> None:\n        self._engine: RolloutEngine = engine\n"
    sub = "class Gated(Wrapper):\n    def go(self) -> None:\n        self._engine.generate_stream()\n"
    assert check_source(sub, class_bindings([base])).problems == [
        "line 3: self._engine.generate_stream is not a member of RolloutEngine"
    ]
    assert check_source(sub).problems == []  # without its base the attribute is unknown


def test_no_engine_in_the_workers_is_typed_any() -> None:
    """An engine typed ``Any`` would leave its uses unchecked, here and by mypy."""
    found = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            named: list[tuple[str, ast.expr | None]] = []
            if isinstance(node, ast.AnnAssign):
                named.append((ast.unparse(node.target), node.annotation))
            elif isinstance(node, ast.FunctionDef):
                named += [(a.arg, a.annotation) for a in [*node.args.args, *node.args.kwonlyargs]]
            for name, annotation in named:
                if "engine" in name.lower() and annotation is not None and "Any" in ast.unparse(annotation):
                    found.append(f"{path.name}:{node.lineno}: {name}: {ast.unparse(annotation)}")
    assert found == []
