"""Prefect's temporary API server as a run starts it (flows/prefect_api.py): it answers, this
process points at it, it is stopped at the end, and a run killed by SIGKILL takes it along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

from rl_train.flows import prefect_api
from rl_train.flows.prefect_api import (
    TEMPORARY_API_ENV,
    PrefectAPIError,
    TemporaryPrefectAPI,
    user_configured_api,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_server_answers_and_is_gone_after_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PREFECT_API_URL", TEMPORARY_API_ENV):
        monkeypatch.delenv(key, raising=False)
    api = TemporaryPrefectAPI(startup_timeout_s=120)
    url = api.start()
    try:
        assert os.environ["PREFECT_API_URL"] == url == os.environ[TEMPORARY_API_ENV]
        assert not user_configured_api()  # ours, not a server of the user's
        api.wait_ready()
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            assert answer.status == 200
        pid = api.process.pid  # type: ignore[union-attr]
    finally:
        api.stop()
    assert not _alive(pid)
    api.stop()  # twice is fine


def test_a_server_that_dies_is_an_error_with_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PREFECT_API_URL", TEMPORARY_API_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(prefect_api, "APP_FACTORY", "rl_train.no_such_module:create_app")
    api = TemporaryPrefectAPI(startup_timeout_s=60)
    api.start()
    with pytest.raises(PrefectAPIError, match="exited(.|\n)*no_such_module"):
        api.wait_ready()


def test_a_database_from_a_newer_prefect_is_named_with_what_to_do(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's Alembic revision is one this Prefect does not know, as after a newer
    Prefect in another environment migrated the shared home's database: the server refuses to
    start, and the error says which database, why, and how to run anyway; the database keeps
    its revision (no downgrade is tried)."""
    import sqlite3

    for key in ("PREFECT_API_URL", TEMPORARY_API_ENV, "PREFECT_API_DATABASE_CONNECTION_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    database = tmp_path / "prefect.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('ffffffffffff')")
    api = TemporaryPrefectAPI(startup_timeout_s=120)
    api.start()
    with pytest.raises(PrefectAPIError) as failure:
        api.wait_ready()
    message = str(failure.value)
    assert "Can't locate revision" in message
    assert f"cannot read the database {database}: a newer Prefect has migrated it" in message
    assert "export PREFECT_HOME=" in message
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("ffffffffffff",)]


def test_the_hint_is_only_for_a_refused_database(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prefect_api.database_hint("ModuleNotFoundError: no_such_module") == ""
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://db/prefect")
    assert "the database postgresql+asyncpg://db/prefect:" in prefect_api.database_hint("Can't locate revision 'x'")


def test_a_killed_run_takes_its_server_along(tmp_path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys, time
        for key in ("PREFECT_API_URL", {TEMPORARY_API_ENV!r}):
            os.environ.pop(key, None)
        from rl_train.flows.prefect_api import TemporaryPrefectAPI
        api = TemporaryPrefectAPI(120)
        api.start()
        api.wait_ready()
        print(api.process.pid, flush=True)
        time.sleep(600)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    server = int(run.stdout.readline())
    assert _alive(server)
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 15
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server), "the server outlived the run that started it"


def test_a_user_server_is_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.delenv(TEMPORARY_API_ENV, raising=False)
    assert user_configured_api()
