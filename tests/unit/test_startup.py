"""The parallel start-up (flows/startup.py): light to import, errors of its helper thread
raised in the caller, and a temporary Prefect API only when the run would start one."""

from __future__ import annotations

import pytest
from import_probe import imported_after

import rl_train.engines.workers.ray_start as ray_start
from rl_train.flows import startup


def test_importing_the_startup_module_imports_none_of_what_it_warms() -> None:
    heavy = ("torch", "transformers", "prefect", "ray")
    assert imported_after("import rl_train.flows.startup", heavy) == []


def test_an_error_of_the_helper_thread_is_raised_in_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str | None] = []
    monkeypatch.setattr(ray_start, "ensure_ray", lambda address, num_cpus, num_actors=0: started.append(address))
    monkeypatch.setattr(startup, "HEAVY_MODULES", ("rl_train.no_such_module",))
    with pytest.raises(ModuleNotFoundError, match="rl_train.no_such_module"):
        startup.warm_start("ray://head:10001", None, use_prefect=False)
    assert started == ["ray://head:10001"]  # Ray was started in this thread all the same


def test_warm_start_reports_when_each_part_was_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_start, "ensure_ray", lambda address, num_cpus, num_actors=0: None)
    monkeypatch.setattr(startup, "HEAVY_MODULES", ("json",))
    times = startup.warm_start(None, None, use_prefect=False)
    assert times.prefect is None and 0 <= times.ray <= times.total and 0 <= times.imports <= times.total


@pytest.mark.parametrize(
    ("use_prefect", "env", "expected"),
    [
        (False, {}, False),
        (True, {}, True),
        (True, {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, False),  # a server of the user's
        (True, {"PREFECT_SERVER_EPHEMERAL_ENABLED": "false"}, False),
    ],
)
def test_a_temporary_prefect_api_only_when_the_run_would_start_one(
    monkeypatch: pytest.MonkeyPatch, use_prefect: bool, env: dict[str, str], expected: bool
) -> None:
    for key in ("PREFECT_API_URL", "PREFECT_SERVER_EPHEMERAL_ENABLED"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert startup.needs_temporary_prefect_api(use_prefect) is expected


def test_the_driver_does_not_import_transformers_models() -> None:
    """The driver builds no model (its workers do): importing the flows must not pull in
    transformers' modeling code, which costs about a second of start-up CPU per process."""
    statement = "import rl_train.flows.train, rl_train.flows.registry"
    assert imported_after(statement, ("transformers.modeling_utils",)) == []
