"""Weight sync's contract: optional hooks are declared Protocols, errors sit below everything.

Parses the package's imports and calls (without running them) to keep two rules true: the
low-level modules never import the orchestration above them, and no caller discovers a
hook by its name. Then checks that each hook changes what ``run_sender`` / ``run_receiver``
do, and that the built-in pieces declare the hooks they offer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from weight_sync_engine import SparseTinyRolloutEngine, TinyRolloutEngine

from rl_train.engines.weight_sync import boundaries, errors
from rl_train.engines.weight_sync.backends import WEIGHT_SYNC_BACKENDS
from rl_train.engines.weight_sync.base import (
    AbortableTensors,
    AcceptsSparseUpdates,
    LoadsIntoEngine,
    NamedTensors,
    ReportsSyncMetrics,
    accepts_sparse_updates,
)
from rl_train.engines.weight_sync.boundaries import ReceiveError, run_receiver, run_sender
from rl_train.engines.weight_sync.bucketed import BucketedSender
from rl_train.engines.weight_sync.delta import DeltaSender
from rl_train.engines.weight_sync.naive import NaiveReceiver, NaiveSender
from rl_train.engines.weight_sync.stream_receiver import StreamedTensors
from rl_train.engines.weight_sync.transports import PlacesDirect
from rl_train.engines.weight_sync.transports import mooncake as mooncake_transport
from rl_train.engines.weight_sync.transports import tcp as tcp_transport

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "rl_train" / "engines" / "weight_sync"
LOW_LEVEL = [
    "errors.py", "frame.py", "wire.py", "buckets.py", "delta_codec.py", "delta_diff.py",
    "stream.py", "stream_receiver.py", *(f"transports/{p.name}" for p in (PACKAGE / "transports").glob("*.py")),
]  # fmt: skip
UPPER = {"base", "boundaries", "bucketed", "delta", "naive", "config"}
HOOKS = {"sync_metrics", "load_into", "close", "place_direct", "release", "update_weights_sparse", "uses_transport"}


def _imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            if node.module == "rl_train.engines.weight_sync":  # from the package import a module
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_low_level_modules_never_import_the_orchestration_above_them() -> None:
    upward = [
        f"{name} imports {module}"
        for name in LOW_LEVEL
        for module in _imported_modules(PACKAGE / name)
        if module.startswith("rl_train.engines.weight_sync.") and module.split(".")[3] in UPPER
    ]
    assert not upward, "\n".join(upward)


def test_no_module_of_the_package_imports_pickle() -> None:
    # Bytes from a socket are never unpickled: the wire format is JSON and raw bytes.
    users = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(module.split(".")[0] in ("pickle", "cloudpickle", "dill") for module in _imported_modules(path))
    ]
    assert not users, users


def test_optional_hooks_are_never_looked_up_by_name() -> None:
    lookups = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in HOOKS
            ):
                lookups.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert not lookups, "\n".join(lookups)


def test_the_errors_keep_their_old_import_path() -> None:
    for name in ("WeightSyncError", "QuiesceError", "ExportError", "TransportError", "ReceiveError", "RecoverError"):
        assert getattr(boundaries, name) is getattr(errors, name)
    assert issubclass(errors.WireFormatError, errors.TransportError)
    assert issubclass(errors.PeerRefusedError, errors.TransportError)
    assert "boundary 'transport'" in str(errors.WireFormatError("bad magic"))


def test_every_backend_declares_handover_and_transport_use() -> None:
    declared = {
        name: (WEIGHT_SYNC_BACKENDS.get(name).handover, WEIGHT_SYNC_BACKENDS.get(name).uses_transport)
        for name in WEIGHT_SYNC_BACKENDS.names()
    }
    assert declared == {"bucketed": (False, True), "delta": (False, True), "naive": (True, False)}


def test_built_in_pieces_declare_the_hooks_they_offer() -> None:
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

    assert issubclass(BucketedSender, ReportsSyncMetrics) and issubclass(DeltaSender, ReportsSyncMetrics)
    assert not issubclass(NaiveSender, ReportsSyncMetrics)
    assert issubclass(StreamedTensors, LoadsIntoEngine) and issubclass(StreamedTensors, AbortableTensors)
    assert issubclass(mooncake_transport.Sender, PlacesDirect)
    assert not issubclass(tcp_transport.Sender, PlacesDirect)
    assert issubclass(TorchRolloutEngine, AcceptsSparseUpdates)
    assert accepts_sparse_updates(SparseTinyRolloutEngine({}))
    assert not accepts_sparse_updates(TinyRolloutEngine({}))


WEIGHTS = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
EXPORT_BYTES = 6 * 4 + 4 * 2


class _MeteredNaiveSender(NaiveSender):
    """Naive handover plus the metrics hook, as a sender that compresses would report."""

    def sync_metrics(self) -> dict[str, float]:
        return {"weight_sync/bytes": 5.0, "weight_sync/full_resync": 0.0}


def test_run_sender_merges_the_metrics_hook_only_where_declared() -> None:
    _, plain = run_sender(NaiveSender(), lambda: iter(WEIGHTS.items()), 1)
    assert plain["weight_sync/bytes"] == plain["weight_sync/export_bytes"] == EXPORT_BYTES
    assert "weight_sync/full_resync" not in plain
    _, metered = run_sender(_MeteredNaiveSender(), lambda: iter(WEIGHTS.items()), 1)
    assert metered["weight_sync/bytes"] == 5.0  # the hook's figure wins
    assert metered["weight_sync/export_bytes"] == EXPORT_BYTES


class _SelfLoading:
    """What a receiver may return: it loads itself (here: every tensor doubled) and can be aborted."""

    def __init__(self, tensors: dict[str, torch.Tensor], fail: bool = False) -> None:
        self.tensors, self.fail, self.closed = tensors, fail, False

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors.items())

    def load_into(self, engine: Any, version: int) -> None:
        if self.fail:
            raise RuntimeError("out of memory")
        engine.update_weights(((name, t * 2) for name, t in self.tensors.items()), version)

    def close(self) -> None:
        self.closed = True


class _Handing:
    def __init__(self, named_tensors: NamedTensors) -> None:
        self.named_tensors = named_tensors

    def receive(self, payload: Any, timeout_seconds: float) -> tuple[NamedTensors, int]:
        return self.named_tensors, 3

    def close(self) -> None:
        return None


def test_run_receiver_lets_declared_tensors_load_themselves_and_aborts_them_on_failure() -> None:
    engine = TinyRolloutEngine(WEIGHTS)
    run_receiver(engine, NaiveReceiver(), {"version": 3, "tensors": WEIGHTS}, 3, 1.0)
    assert torch.equal(engine.weights()["w"], WEIGHTS["w"])  # plain pairs: update_weights as is
    run_receiver(engine, _Handing(_SelfLoading(WEIGHTS)), None, 3, 1.0)
    assert torch.equal(engine.weights()["w"], WEIGHTS["w"] * 2)  # load_into took over
    failing = _SelfLoading(WEIGHTS, fail=True)
    with pytest.raises(ReceiveError, match="out of memory"):
        run_receiver(engine, _Handing(failing), None, 3, 1.0)
    assert failing.closed


def test_fault_injection_lives_in_the_tests() -> None:
    from weight_sync_faults import CorruptingDeltaSender

    assert issubclass(CorruptingDeltaSender, DeltaSender)
    assert not hasattr(DeltaSender, "corrupt")  # production senders carry no test hook
