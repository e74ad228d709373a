"""How rl-train decides Ray's authentication mode and which addresses it joins over loopback.

A token in the environment turns token auth on (``runtime.default_ray_auth_mode``); a user's own
``RAY_AUTH_MODE`` always wins; with neither, auth is off (the local head listens on loopback
only). The cluster behaviour itself is tested in tests/integration/test_ray_token_auth.py and
test_local_ray_head.py.
"""

from __future__ import annotations

import os

import pytest

from rl_train.engines.workers.local_ray_head import is_loopback_address
from rl_train.runtime import apply_local_defaults, default_ray_auth_mode


@pytest.fixture(autouse=True)
def _clean_auth_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, "disabled"),
        ({"RAY_AUTH_TOKEN": "a-token"}, "token"),
        ({"RAY_AUTH_TOKEN_PATH": "/run/secrets/ray_token"}, "token"),
        ({"RAY_AUTH_TOKEN": ""}, "disabled"),
        ({"RAY_AUTH_TOKEN": "a-token", "RAY_AUTH_MODE": "disabled"}, "disabled"),  # the user's word wins
        ({"RAY_AUTH_MODE": "token"}, "token"),
    ],
)
def test_a_token_in_the_environment_turns_token_auth_on(
    env: dict[str, str], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    default_ray_auth_mode()
    assert os.environ["RAY_AUTH_MODE"] == mode


def test_the_cli_defaults_keep_a_given_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", {**os.environ, "RAY_AUTH_TOKEN": "a-token"})  # the session's stays as is
    apply_local_defaults()
    assert os.environ["RAY_AUTH_MODE"] == "token"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("127.0.1.1:40000", True),
        ("10.0.0.5:6379", False),
        ("head.cluster:6379", False),
        ("ray://127.0.0.1:10001", False),  # Ray Client: its own protocol, left as it is
    ],
)
def test_which_addresses_are_joined_over_loopback(address: str, loopback: bool) -> None:
    assert is_loopback_address(address) is loopback
