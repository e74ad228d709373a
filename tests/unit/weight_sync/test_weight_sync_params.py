"""Every weight-sync transport is in every parameter list that names transports: one this machine
cannot run is there as a skip whose reason says why and what to install (and the skip rule of
``tests/skip_policy.py`` fails it), never a case that silently is not there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import weight_sync_helpers
from weight_sync_helpers import available_transports, bucketed_pairs, runnable_pairs, transport_params

from rl_train.engines.weight_sync.transports import TRANSPORTS

MISSING = (
    "weight-sync transport 'mooncake' is unavailable here (libibverbs.so.1: cannot open shared object file); "
    "install: apt-get install -y libibverbs1"
)


def _skip_reasons(param) -> list[str]:
    return [mark.kwargs["reason"] for mark in param.marks if mark.name == "skip"]


@pytest.fixture
def mooncake_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine, as one without libibverbs sees it."""

    def check(name: str) -> None:
        if name == "mooncake":
            raise ValueError(MISSING)

    monkeypatch.setattr(weight_sync_helpers, "check_transport_available", check)


def test_an_unavailable_transport_stays_in_each_list_as_a_skip_with_its_reason(mooncake_missing) -> None:
    for params in (runnable_pairs(), transport_params(), bucketed_pairs()):
        assert {p.values[-1] for p in params} >= set(TRANSPORTS.names())  # the transport is the last value
        for param in params:
            expected = [MISSING] if param.values[-1] == "mooncake" else []
            assert _skip_reasons(param) == expected, param
    assert available_transports() == [name for name in TRANSPORTS.names() if name != "mooncake"]


def test_each_test_over_transports_lists_them_all_skipping_the_unavailable(mooncake_missing) -> None:
    """Each test module of this folder, loaded afresh on a machine without Mooncake: every test
    parametrized over ``transport`` still lists every transport, Mooncake's cases as skips (a
    list built from ``available_transports()`` would drop them, and no one would see)."""
    checked = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"_params_of_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # its parameter lists are built now, without Mooncake
        for name, function in vars(module).items():
            for mark in getattr(function, "pytestmark", []):
                if mark.name == "parametrize" and "transport" in _arg_names(mark.args[0]):
                    _check_transports(path.name, name, _arg_names(mark.args[0]), mark.args[1])
                    checked.append(name)
        if path.stem == "test_weight_sync_mooncake_direct":
            assert [m.kwargs["reason"] for m in module.pytestmark if m.name == "skip"] == [MISSING]
    assert len(checked) >= 5, checked  # the conformance, failure and fan-out tests at least


def _arg_names(names: str | tuple[str, ...]) -> list[str]:
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def _check_transports(module: str, test: str, names: list[str], params: list) -> None:
    by_transport: dict[str, list[list[str]]] = {}
    for param in params:
        values = param.values if hasattr(param, "values") else param
        values = values if isinstance(values, tuple) else (values,)
        reasons = _skip_reasons(param) if hasattr(param, "marks") else []
        by_transport.setdefault(values[names.index("transport")], []).append(reasons)
    assert set(by_transport) >= set(TRANSPORTS.names()), (module, test, sorted(by_transport))
    assert all(r == [MISSING] for r in by_transport["mooncake"]), (module, test, by_transport["mooncake"])
