"""The whole gateway API fuzzed from its OpenAPI schema (Schemathesis), against the real server.

Every operation is driven with requests that fit the schema and with requests that break it,
a fixed number of each, derandomized (the same requests on every run). Each fuzzed request
comes from a session of its own whose task is empty, so that any first message is the task's
and the valid ones reach the engine. Nothing may answer 5xx, every refusal has OpenAI's error
shape, and all the while a watcher thread keeps opening other sessions and asking them for a
turn: each must be answered promptly, during and after every batch."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from gateway_fixture import CALL, MODEL, Scripted, open_session, served
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.model.tokenizer import load_tokenizer

EXAMPLES = {"POST /v1/chat/completions": 120, "GET /v1/models": 15}
"""Requests per operation and generation mode: about 270 in all, some seconds of CI."""
GRACE_S = 20.0
WATCH_EVERY_S = 0.2


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path) -> Iterator[tuple[GatewayCore, GatewayServer]]:
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = Scripted(tokenizer, [CALL, "42"])
    with served(engine.one, tokenizer) as running:
        yield running


class _Watcher:
    """Another session's turn, asked for again and again while the fuzzer runs: the slowest
    answer and every failure are kept."""

    def __init__(self, core: GatewayCore, server: GatewayServer) -> None:
        self.core, self.server = core, server
        self.failures: list[str] = []
        self.slowest_s, self.answered = 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._names = itertools.count()

    def ask(self) -> None:
        session = open_session(self.core, f"watch/{next(self._names)}")
        started = time.monotonic()
        try:
            answer = requests.post(
                f"{self.server.base_url}/chat/completions", timeout=GRACE_S, headers={"authorization": f"Bearer {session.token}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": "12+30="}]},
            )  # fmt: skip
            if answer.status_code != 200:
                self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
        except requests.RequestException as error:
            self.failures.append(repr(error))
        self.slowest_s = max(self.slowest_s, time.monotonic() - started)
        self.answered += 1
        self.core.end_session(session.session_id)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            self.ask()

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(GRACE_S * 2)


def _fuzz(operation: Any, mode: GenerationMode, count: int, core: GatewayCore, server: GatewayServer) -> list[int]:
    """``count`` requests of ``mode`` to ``operation``; their statuses. Every tenth keeps the
    Authorization header the fuzzer made; the others carry a fresh session's token."""
    statuses: list[int] = []
    names = itertools.count()

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        index = next(names)
        session = core.open_session(f"fuzz/{mode.value}/{operation.label}/{index}", 40, 4, task_ids=[core.tokenizer.bos_token_id])
        headers = None if index % 10 == 0 else {"Authorization": f"Bearer {session.token}"}
        started = time.monotonic()
        response = case.call(base_url=server.base_url.removesuffix("/v1"), headers=headers, timeout=GRACE_S)
        assert time.monotonic() - started < GRACE_S
        assert response.status_code < 500, (case.body, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"] and error["type"], response.text[:500]
        statuses.append(response.status_code)
        core.end_session(session.session_id)

    one()
    return statuses


def test_the_fuzzed_api_never_answers_5xx_and_never_stalls_another_session(gateway) -> None:
    core, server = gateway
    schema = schemathesis.openapi.from_dict(server.app.openapi())
    operations = {result.ok().label: result.ok() for result in schema.get_all_operations()}
    assert sorted(operations) == sorted(EXAMPLES)  # a new route must be fuzzed too
    seen: dict[str, set[int]] = {}
    with _Watcher(core, server) as watcher:
        for label, operation in operations.items():
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                statuses = _fuzz(operation, mode, EXAMPLES[label], core, server)
                seen[f"{mode.value} {label}"] = set(statuses)
                watcher.ask()  # between batches, too
    watcher.ask()
    assert watcher.failures == [], watcher.failures[:5]
    assert watcher.answered >= 5 and watcher.slowest_s < GRACE_S
    # the fuzzer reached past the first checks: valid requests were answered, invalid ones refused
    assert 200 in seen["positive POST /v1/chat/completions"] and 400 in seen["negative POST /v1/chat/completions"]
    assert 401 in seen["positive GET /v1/models"] and 200 in seen["positive GET /v1/models"]
    assert len(core.store) == 0  # every session the test opened was ended
