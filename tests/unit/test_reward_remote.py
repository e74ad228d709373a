"""The remote reward (engines/reward/remote.py) against real servers on free loopback ports: the
config's rewards served by ``RewardServer`` (remote_server.py, what ``rl-train serve-reward``
runs), and small scripted HTTP servers for the answers no honest server gives (garbage, wrong
counts, NaN, 5xx, silence). Every server is closed by its fixture: no port outlives a test."""

from __future__ import annotations

import http.server
import importlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from rl_train.engines.reward.base import RewardResult, ToolCall, Trajectory
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.remote import RemoteReward
from rl_train.engines.reward.remote_config import RemoteRewardConfig
from rl_train.engines.reward.remote_server import RewardServer, ServeLimits, create_reward_app
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.reward.wire import encode_request

PLUGIN = "rl_train_remote_reward_plugin_under_test"
PLUGIN_SOURCE = '''
import threading, time
from rl_train.engines.reward.base import RewardResult

def echo(trajectory):
    """Reads what crossed the wire: the extra columns, the tool calls, the turns."""
    tests = trajectory.extra.get("tests", ())
    return RewardResult(
        float(trajectory.response == trajectory.ground_truth),
        {"tests": float(len(tests)), "tool_errors": float(sum(c.error for c in trajectory.tool_calls)), "turns": float(trajectory.turns)},
    )

def slow(trajectory):
    time.sleep(0.15)
    return 1.0

def broken(trajectory):
    raise RuntimeError("a bug in the served reward")
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    importlib.invalidate_caches()
    return PLUGIN


def trajectories(n: int, data_source: str = "echo/x") -> list[Trajectory]:
    return [
        Trajectory(
            prompt=f"{i}+1=", response=str(i + 1 - i % 2), graded_text="g", transcript="t", data_source=data_source,
            ground_truth=str(i + 1), extra={"tests": ("a", "b")[: i % 3], "meta": {"k": [1, 2]}},
            tool_calls=(ToolCall("calc", i % 2 == 1, 0.5),), turns=1 + i % 2, stop_reason="eos",
        )  # fmt: skip
        for i in range(n)
    ]


def client(url: str, **config: Any) -> RemoteReward:
    return RemoteReward("rm", RemoteRewardConfig(url=url, **{"backoff_s": 0.05, **config}))


class Served:
    """A ``RewardServer`` of a reward section, and the most requests it saw in flight at once."""

    def __init__(self, reward: dict[str, Any], limits: ServeLimits | None = None, token: str | None = None) -> None:
        app = create_reward_app(RewardRouter(RewardConfig.model_validate(reward)), limits, token)
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

        @app.middleware("http")
        async def count(request: Any, call_next: Any) -> Any:
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                return await call_next(request)
            finally:
                with self.lock:
                    self.in_flight -= 1

        self.server = RewardServer(app, has_token=token is not None).start()
        self.url = self.server.url


@pytest.fixture
def serve(plugin: str) -> Iterator[Any]:
    started: list[Served] = []

    def start(reward: dict[str, Any] | None = None, limits: ServeLimits | None = None, token: str | None = None) -> Served:
        served = Served(reward or {"by_data_source": {"echo": f"{plugin}:echo", "slow": f"{plugin}:slow", "bug": f"{plugin}:broken"}}, limits, token)
        started.append(served)
        return served

    yield start
    for served in started:
        served.server.stop()


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the server's next (status, body, delay_s); the last repeats."""

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        server: Any = self.server
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with server.lock:
            server.requests += 1
            status, body, delay_s = server.script.pop(0) if len(server.script) > 1 else server.script[0]
        time.sleep(delay_s)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(*script: tuple[int, Any, float]) -> Any:
        server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
        server.daemon_threads = True
        server.script, server.requests, server.lock = list(script), 0, threading.Lock()
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        server.url = f"http://127.0.0.1:{server.server_address[1]}/v1/score"
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def good(n: int, score: float = 1.0) -> dict[str, Any]:
    return {"version": 1, "results": [{"score": score, "sub_scores": {"s": 2.0}, "is_infra": False, "reason": ""}] * n}


# -- an honest server -----------------------------------------------------------------------------
def test_remote_scores_equal_the_served_rewards_scored_locally(serve: Any, plugin: str) -> None:
    served = serve()
    batch = trajectories(7)
    remote = client(served.url, batch_size=3)
    local = RewardRouter(RewardConfig.model_validate({"by_data_source": {"echo": f"{plugin}:echo"}})).score(batch)
    assert remote.score_batch(batch) == local
    assert [r.score for r in local] == [1.0, 0.0] * 3 + [1.0] and local[2].sub_scores == {"tests": 2.0, "tool_errors": 0.0, "turns": 1.0}
    remote.close()


def test_the_concurrency_cap_is_never_exceeded(serve: Any) -> None:
    served = serve(limits=ServeLimits(parallel=8))  # the server would take 8 at once
    remote = client(served.url, batch_size=2, max_concurrency=3)
    results = remote.score_batch(trajectories(20, "slow/x"))  # 10 chunks of 2, 0.3 s each
    assert [r.score for r in results] == [1.0] * 20
    assert served.most_in_flight == 3  # the cap, and reached: chunks did run side by side
    remote.close()


def test_a_token_is_required_where_the_server_has_one(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    served = serve(token="s3cret")
    [refused] = client(served.url).score_batch(trajectories(1))
    assert refused.is_infra and "HTTP 401" in refused.reason and "tries" not in refused.reason  # not retried
    monkeypatch.setenv("RM_TOKEN", "s3cret")
    remote = RemoteReward.from_config("rm", RemoteRewardConfig(url=served.url, api_key_env="RM_TOKEN"))
    assert not remote.score_batch(trajectories(1))[0].is_infra
    monkeypatch.delenv("RM_TOKEN")
    with pytest.raises(ValueError, match="reward.remote.rm.api_key_env: the environment variable RM_TOKEN is not set"):
        RemoteReward.from_config("rm", RemoteRewardConfig(url=served.url, api_key_env="RM_TOKEN"))
    with pytest.raises(ValueError, match="beyond loopback needs a token"):
        RewardServer(create_reward_app(RewardRouter()), host="0.0.0.0", port=0)


def test_the_server_refuses_a_body_over_its_cap_with_413_and_bad_requests_with_400(serve: Any) -> None:
    served = serve(limits=ServeLimits(max_body_bytes=4096, max_batch=4))
    big = encode_request(trajectories(1) * 4)[:-2] + b' ' * 5000 + b']}'
    assert httpx.post(served.url, content=big, timeout=10).status_code == 413
    [result] = client(served.url, max_retries=1).score_batch([Trajectory.of_answer({"data_source": "echo", "ground_truth": "1"}, "x" * 5000)])
    assert result.is_infra and "HTTP 413" in result.reason
    one = json.loads(encode_request(trajectories(1)))
    bad = [
        {**one, "version": 2},
        {**one, "pickle": "x"},
        {"version": 1, "trajectories": []},
        {"version": 1, "trajectories": one["trajectories"] * 5},  # over max_batch
        {"version": 1, "trajectories": [{**one["trajectories"][0], "secret": 1}]},
        {"version": 1, "trajectories": [{k: v for k, v in one["trajectories"][0].items() if k != "prompt"}]},
        {"version": 1, "trajectories": [{**one["trajectories"][0], "turns": True}]},
        {"version": 1, "trajectories": [{**one["trajectories"][0], "tool_calls": [{"name": "c", "error": 1, "seconds": 0}]}]},
        {"version": 1, "trajectories": [{**one["trajectories"][0], "data_source": "nobody/routes"}]},
        {"version": 1, "trajectories": [{**one["trajectories"][0], "messages": [{"role": "tool"}]}]},
    ]
    for body in bad:
        answer = httpx.post(served.url, json=body, timeout=10)
        assert answer.status_code == 400 and answer.json()["error"]["message"], body
    assert httpx.post(served.url, content=b'{"version": 1, "trajectories": [NaN]}', timeout=10).status_code == 400
    assert httpx.post(served.url, content=b"\x80\x81", timeout=10).status_code == 400


def test_a_served_reward_that_raises_is_a_500_and_infra_after_the_retries(serve: Any) -> None:
    served = serve()
    [result] = client(served.url, max_retries=1).score_batch(trajectories(1, "bug/x"))
    assert result.is_infra and "HTTP 500" in result.reason and "after 2 tries" in result.reason


# -- servers that misbehave ----------------------------------------------------------------------
def test_5xx_and_429_are_retried_then_the_answer_is_used(scripted: Any) -> None:
    server = scripted((503, {"error": {}}, 0.0), (429, b"slow down", 0.0), (502, b"", 0.0), (200, good(2, 0.5), 0.0))
    results = client(server.url, max_retries=3).score_batch(trajectories(2))
    assert results == [RewardResult(0.5, {"s": 2.0})] * 2 and server.requests == 4


def test_failures_past_the_retries_are_infra(scripted: Any) -> None:
    server = scripted((500, b"down", 0.0))
    results = client(server.url, max_retries=2).score_batch(trajectories(3))
    assert all(r.is_infra and "HTTP 500" in r.reason and "after 3 tries" in r.reason for r in results)
    assert server.requests == 3


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>oops</html>", "not JSON"),
        (b'{"version": 1, "results": [{"score": NaN}, {"score": 1}]}', "not JSON"),
        (b'{"version": 1, "results": [{"score": 1e999}, {"score": 1}]}', "not JSON"),
        (good(3), "got 3, expected a list of 2"),
        (good(1), "got 1, expected a list of 2"),
        ({"version": 2, "results": good(2)["results"]}, "version"),
        ({"version": 1, "results": [{"score": True}, {"score": 1}]}, "results\\[0\\].score"),
        ({"version": 1, "results": [{"score": "1"}, {"score": 1}]}, "results\\[0\\].score"),
        ({"version": 1, "results": [{"score": 1, "extra": 1}, {"score": 1}]}, "results\\[0\\]"),
        ({"version": 1, "results": [{"score": 1, "sub_scores": {"a": None}}, {"score": 1}]}, "sub_scores.a"),
        ({"version": 1, "results": [{"score": 1, "is_infra": "no"}, {"score": 1}]}, "is_infra"),
        ([1, 2], "not {'version', 'results'}"),
    ],
)
def test_a_malformed_answer_is_infra_never_trusted(scripted: Any, body: Any, why: str) -> None:
    server = scripted((200, body, 0.0))
    results = client(server.url).score_batch(trajectories(2))
    assert all(r.is_infra and "malformed answer" in r.reason for r in results), results
    assert pytest.approx(0) == sum(r.score for r in results)
    import re

    assert re.search(why, results[0].reason), results[0].reason
    assert server.requests == 1  # a malformed answer is not retried here (the router retries infra)


def test_an_infra_result_from_the_server_stays_infra(scripted: Any) -> None:
    server = scripted((200, {"version": 1, "results": [{"score": 0, "is_infra": True, "reason": "sandbox died"}]}, 0.0))
    [result] = client(server.url).score_batch(trajectories(1))
    assert result.is_infra and result.reason == "remote: sandbox died"


def test_an_answer_over_the_size_cap_is_infra(scripted: Any) -> None:
    server = scripted((200, b" " * 4096 + json.dumps(good(1)).encode(), 0.0))
    [result] = client(server.url, max_response_bytes=1024).score_batch(trajectories(1))
    assert result.is_infra and "max_response_bytes" in result.reason


def test_a_server_that_hangs_is_infra_within_the_limit(scripted: Any) -> None:
    server = scripted((200, good(1), 30.0))
    remote = client(server.url, timeout_s=0.5, max_retries=1, backoff_s=0.1)
    started = time.monotonic()
    [result] = remote.score_batch(trajectories(1))
    elapsed = time.monotonic() - started
    assert result.is_infra and "ReadTimeout" in result.reason and "after 2 tries" in result.reason, result
    assert elapsed < 2 * 0.5 + 0.1 + 5.0  # two tries and a backoff, plus a loaded machine's grace
    assert server.requests == 2


def test_nothing_listening_is_infra() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    [result] = client(f"http://127.0.0.1:{port}/v1/score", max_retries=1).score_batch(trajectories(1))
    assert result.is_infra and "ConnectError" in result.reason


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"url": "ftp://x/score"}, "remote.rm.url.*http:// or https://"),
        ({"url": "http://user:pw@host/score"}, "remote.rm.url.*no credentials"),
        ({"url": "http://h/s", "api_key_env": "sk-abc123"}, "remote.rm.api_key_env.*not the key itself"),
        ({"url": "http://h/s", "max_concurrency": 0}, "remote.rm.max_concurrency"),
    ],
)
def test_a_bad_remote_section_fails_at_load_naming_its_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=f"(?s){message}"):
        RewardConfig.model_validate({"remote": {"rm": entry}})


def test_serve_reward_serves_a_configs_rewards_until_sigterm_and_frees_its_port() -> None:
    """``rl-train serve-reward`` as a user runs it: the demo config's reward (exact match on the
    arithmetic task, routed by data_source), on a free loopback port it prints."""
    import os
    import signal
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "rl_train.cli", "serve-reward", "--config", str(repo / "configs" / "arith-tiny.yaml")]
    env = {**os.environ, "RL_TRAIN_REWARD_TOKEN": ""}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=repo)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving rewards at http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        url = line.split()[-1]
        rows = [{"prompt": "3+4=", "data_source": "arith/single_digit_sum", "ground_truth": "7"}] * 2
        remote = client(url)
        results = remote.score_batch([Trajectory.of_answer(rows[0], "7"), Trajectory.of_answer(rows[1], " 8")])
        remote.close()
        assert [r.score for r in results] == [1.0, 0.0] and not any(r.is_infra for r in results)
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then re-raises the signal it caught: the usual status of a SIGTERM
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # free again


def test_the_wire_carries_a_trajectorys_turns_for_a_remote_reward_model() -> None:
    from rl_train.engines.reward.base import Message
    from rl_train.engines.reward.wire import decode_request

    turns = (Message("assistant", '<tool_call>{"name": "calculator"}</tool_call>'), Message("tool", "1023"), Message("assistant", "1023"))
    sent = Trajectory(prompt="345+678=", response="1023", graded_text="", transcript="", data_source="arith", ground_truth="1023", turns=2, messages=turns)
    [got] = decode_request(json.loads(encode_request([sent])), max_batch=4)
    assert got.messages == turns and got.chat() == sent.chat()
