"""``trainer.step_layout: auto``: a step's own flow run only where a UI can show it."""

from __future__ import annotations

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from rl_train.flows.prefect_api import TEMPORARY_API_ENV
from rl_train.flows.ui import resolve_step_layout

URL = "http://127.0.0.1:4200/api"


@pytest.mark.parametrize("configured", ["nested", "flat"])
def test_an_explicit_layout_is_kept(configured: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEMPORARY_API_ENV, raising=False)
    with temporary_settings(updates={PREFECT_API_URL: URL}):
        assert resolve_step_layout(configured) == configured
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert resolve_step_layout(configured) == configured


def test_auto_nests_on_a_server_of_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEMPORARY_API_ENV, raising=False)
    with temporary_settings(updates={PREFECT_API_URL: URL}):
        assert resolve_step_layout("auto") == "nested"
    monkeypatch.setenv(TEMPORARY_API_ENV, "http://127.0.0.1:5999/api")  # another process's temporary API
    with temporary_settings(updates={PREFECT_API_URL: URL}):
        assert resolve_step_layout("auto") == "nested"


def test_auto_is_flat_on_the_runs_own_temporary_api_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEMPORARY_API_ENV, URL)
    with temporary_settings(updates={PREFECT_API_URL: URL}):
        assert resolve_step_layout("auto") == "flat"
    monkeypatch.delenv(TEMPORARY_API_ENV)
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert resolve_step_layout("auto") == "flat"
