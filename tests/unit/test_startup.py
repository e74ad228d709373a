"""The parallel start-up (flows/startup.py): light to import, errors of its helper thread
raised in the caller, a temporary Prefect API only when the run would start one, and the
run's actors asked for as soon as Ray is up, without waiting for that API."""

from __future__ import annotations

import threading

import pytest
from import_probe import imported_after

import rl_train.engines.workers.ray_start as ray_start
from rl_train.flows import prefect_api, startup


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


class _SlowAPI:
    """Stands in for the temporary Prefect API: it answers only once ``answer`` is set."""

    answer = threading.Event()

    def __init__(self, timeout: float) -> None:
        pass

    def start(self) -> str:
        return "http://127.0.0.1:1/api"

    def wait_ready(self) -> None:
        if not self.answer.wait(10):
            raise TimeoutError("after_ray did not run while the API was coming up")


def test_after_ray_runs_once_ray_and_the_imports_are_up_while_the_api_comes_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rl-train train`` asks Ray for its actors in ``after_ray``: that must not wait for
    Prefect's API (the point is to start them beside it), and must come after Ray."""
    events: list[str] = []
    monkeypatch.setattr(ray_start, "ensure_ray", lambda address, num_cpus, num_actors=0: events.append("ray"))
    monkeypatch.setattr(startup, "HEAVY_MODULES", ("json",))
    monkeypatch.setattr(startup, "needs_temporary_prefect_api", lambda use_prefect: True)
    monkeypatch.setattr(prefect_api, "TemporaryPrefectAPI", _SlowAPI)
    _SlowAPI.answer.clear()

    def after_ray() -> None:
        events.append("after_ray")
        _SlowAPI.answer.set()  # the API answers only after this ran: no deadlock means no wait

    times = startup.warm_start(None, None, use_prefect=True, after_ray=after_ray)
    assert events == ["ray", "after_ray"]
    assert times.prefect is not None and times.prefect >= times.imports


def test_after_ray_is_skipped_when_the_imports_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[bool] = []
    monkeypatch.setattr(ray_start, "ensure_ray", lambda address, num_cpus, num_actors=0: None)
    monkeypatch.setattr(startup, "HEAVY_MODULES", ("rl_train.no_such_module",))
    with pytest.raises(ModuleNotFoundError):
        startup.warm_start(None, None, use_prefect=False, after_ray=lambda: called.append(True))
    assert called == []
