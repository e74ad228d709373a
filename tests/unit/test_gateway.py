"""The OpenAI-compatible gateway, driven by the official ``openai`` client: completions with and
without streaming, tool calls, sessions that only grow and only with their own token, bounds on
size and rate, a few hundred malformed requests, and records identical to the tool loop's."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_fixture import CALL, Scripted, open_session
from openai import OpenAI

from rl_train.engines.agent.batcher import MicroBatcher
from rl_train.engines.agent.chat import generation_spans
from rl_train.engines.agent.gateway import GatewayLimits
from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.agent.loop import AgentLimits, ToolAgentLoop
from rl_train.engines.agent.sessions import SessionStore
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.rollout.protocol import SamplingParams
from rl_train.examples.calculator_agent import CALCULATOR, solve


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def gateway(tokenizer) -> Iterator[tuple[GatewayCore, GatewayServer, Scripted]]:
    engine = Scripted(tokenizer, [CALL, "42"])
    batcher = MicroBatcher(engine, window_s=0.02)
    core = GatewayCore(batcher.generate, tokenizer, lambda: engine.version, SessionStore(max_requests_per_second=1000))
    server = GatewayServer(core, limits=GatewayLimits(max_body_bytes=64 * 1024)).start()
    yield core, server, engine
    server.stop()
    batcher.close()


def _client(server: GatewayServer, token: str) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key=token, max_retries=0, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_a_black_box_agent_solves_its_task_through_the_official_client(gateway, tokenizer, stream: bool) -> None:
    core, server, _ = gateway
    session = open_session(core, "g/0", 200, 4)
    answer = solve(_client(server, session.token), "rl-train-policy", "12+30=", stream=stream)
    assert answer == "42"
    trajectory = core.end_session("g/0")
    text = tokenizer.decode(trajectory.response_ids)
    assert text == f"{CALL}</s><tool_response>42</tool_response>42</s>"
    assert trajectory.turns == 2 and [c.name for c in trajectory.tool_calls] == ["calculator"]
    observed = len(tokenizer.encode("<tool_response>42</tool_response>", add_special_tokens=False))
    assert trajectory.response_mask.count(0) == observed
    assert len(trajectory.log_probs) == len(trajectory.response_ids) == len(trajectory.token_versions)


def test_a_session_asks_to_keep_its_keys_until_its_last_turn(gateway) -> None:
    core, server, engine = gateway
    session = open_session(core, "g/k", 200, 2)
    assert solve(_client(server, session.token), "rl-train-policy", "12+30=") == "42"
    assert engine.keep_kv == [True, False]  # the second turn is the session's last


def test_models_and_tool_calls_look_as_openai_s_do(gateway) -> None:
    core, server, _ = gateway
    session = open_session(core, "g/1", 200, 4)
    client = _client(server, session.token)
    assert [m.id for m in client.models.list().data] == ["rl-train-policy"]
    reply = client.chat.completions.create(model="rl-train-policy", messages=[{"role": "user", "content": "12+30="}], tools=[CALCULATOR])
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "12+30"}
    assert reply.usage.prompt_tokens == 7 and reply.usage.completion_tokens > 0


def test_a_session_only_answers_its_own_token_and_only_grows(gateway) -> None:
    core, server, _ = gateway
    mine = open_session(core, "g/a", 200, 4)
    other = open_session(core, "g/b", 200, 4)
    first = [{"role": "user", "content": "12+30="}]
    _client(server, mine.token).chat.completions.create(model="rl-train-policy", messages=first)
    before = (list(mine.trajectory.response_ids), list(mine.transcript))  # type: ignore[union-attr]
    raw = httpx.Client(base_url=server.base_url, timeout=10)
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic " + mine.token}):
        answer = raw.post("/chat/completions", json={"messages": first}, headers=headers)
        assert answer.status_code == 401, answer.text
    # the other session's token, with this session's history: refused by that session, nothing changes
    hijack = first + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_g/a_1", "type": "function",
              "function": {"name": "calculator", "arguments": '{"expression": "12+30"}'}}]}, {"role": "tool", "tool_call_id": "call_g/a_1", "content": "99"}]  # fmt: skip
    answer = raw.post("/chat/completions", json={"model": "rl-train-policy", "messages": hijack}, headers={"authorization": f"Bearer {other.token}"})
    assert answer.status_code in (400, 409) and answer.json()["error"]["message"]
    assert (list(mine.trajectory.response_ids), list(mine.transcript)) == before  # type: ignore[union-attr]
    # this session, with a history that is not its own: 409, nothing changes
    rewritten = [{"role": "user", "content": "99+1="}, {"role": "user", "content": "more"}]
    answer = raw.post("/chat/completions", json={"model": "rl-train-policy", "messages": rewritten}, headers={"authorization": f"Bearer {mine.token}"})
    assert answer.status_code == 409 and "messages[0]" in answer.json()["error"]["message"]
    assert (list(mine.trajectory.response_ids), list(mine.transcript)) == before  # type: ignore[union-attr]
    core.end_session("g/a")
    answer = raw.post("/chat/completions", json={"messages": first}, headers={"authorization": f"Bearer {mine.token}"})
    assert answer.status_code == 410  # an ended session's token opens nothing, and says it ended
    assert "ended" in answer.json()["error"]["message"]


def test_size_and_rate_are_bounded(tokenizer) -> None:
    engine = Scripted(tokenizer, ["1"])
    batcher = MicroBatcher(engine, window_s=0.0)
    core = GatewayCore(batcher.generate, tokenizer, lambda: 0, SessionStore(max_requests_per_second=3))
    server = GatewayServer(core, limits=GatewayLimits(max_body_bytes=2048)).start()
    try:
        session = open_session(core, "s", 200, 50)
        raw = httpx.Client(base_url=server.base_url, timeout=10, headers={"authorization": f"Bearer {session.token}"})
        big = raw.post("/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]})
        assert big.status_code == 413
        codes = [raw.post("/chat/completions", content=b"{").status_code for _ in range(5)]
        assert codes[:2] == [400, 400] and codes[-1] == 429
    finally:
        server.stop()
        batcher.close()


def _malformed(rng: random.Random) -> bytes | dict:
    pick = rng.randrange(12)
    if pick == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if pick == 1:
        return b'{"messages": [' + b"[" * rng.randrange(1, 50)
    if pick == 2:
        return {"messages": rng.choice([None, 5, "hi", {}, [], [5], [None]])}
    if pick == 3:
        return {"messages": [{"role": rng.choice(["bot", None, 3, "user"]), "content": rng.choice([None, 7, [1], {"a": 1}])}]}
    if pick == 4:
        return {"messages": [{"role": "user", "content": "1+1="}], "temperature": rng.choice([-1, "hot", 9, None, True])}
    if pick == 5:
        return {"messages": [{"role": "user", "content": "1+1="}], "max_tokens": rng.choice([0, -3, "many", 1.5, True])}
    if pick == 6:
        return {"messages": [{"role": "assistant", "content": "x", "tool_calls": rng.choice([5, "x", [5], [{"function": 3}]])}]}
    if pick == 7:
        return {"messages": [{"role": "user", "content": "1+1="}], "stream": rng.choice(["yes", 1, None])}
    if pick == 8:
        return {"messages": [{"role": "tool", "content": "5", "tool_call_id": 3}]}
    if pick == 9:
        return {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    if pick == 10:
        return {"messages": [{"role": "user", "content": "1+1="}], "n": rng.choice([0, 2, "2"])}
    return rng.choice([[], "text", 5, None])  # type: ignore[return-value]


def test_hundreds_of_malformed_requests_crash_nothing_and_touch_no_other_session(gateway) -> None:
    core, server, _ = gateway
    victim = open_session(core, "g/v", 200, 4)
    _client(server, victim.token).chat.completions.create(model="rl-train-policy", messages=[{"role": "user", "content": "12+30="}])
    before = (list(victim.trajectory.response_ids), list(victim.transcript))  # type: ignore[union-attr]
    fuzzed = open_session(core, "g/f", 200, 4)
    raw = httpx.Client(base_url=server.base_url, timeout=10, headers={"authorization": f"Bearer {fuzzed.token}"})
    rng = random.Random(7)
    statuses = []
    for _ in range(300):
        body = _malformed(rng)
        if isinstance(body, dict):
            body = {"model": "rl-train-policy", **body}
        answer = raw.post("/chat/completions", content=body) if isinstance(body, bytes) else raw.post("/chat/completions", json=body)
        statuses.append(answer.status_code)
        assert answer.status_code < 500, (body, answer.text)
        if answer.status_code >= 400:
            assert answer.json()["error"]["message"]
    assert statuses.count(400) > 200
    assert (list(victim.trajectory.response_ids), list(victim.transcript)) == before  # type: ignore[union-attr]
    fresh = open_session(core, "g/after", 200, 4)
    reply = _client(server, fresh.token).chat.completions.create(model="rl-train-policy", messages=[{"role": "user", "content": "12+30="}])
    assert reply.choices[0].message.tool_calls  # the server still answers


def test_the_gateway_and_the_tool_loop_write_the_same_record(gateway, tokenizer) -> None:
    """Identical sampled tokens give identical token-level records, whichever front end."""
    core, server, engine = gateway
    session = open_session(core, "g/same", 200, 4)
    solve(_client(server, session.token), "rl-train-policy", "12+30=")
    via_gateway = core.end_session("g/same")
    loop = ToolAgentLoop(engine, AgentLimits(max_turns=4, max_response_tokens=200))  # type: ignore[arg-type]
    prompt = [tokenizer.bos_token_id, *tokenizer.encode("12+30=", add_special_tokens=False)]
    via_loop = loop.run("g/same", prompt, SamplingParams(max_new_tokens=200))
    for name in ("prompt_ids", "response_ids", "response_mask", "log_probs", "token_versions", "turns", "stop_reason"):
        assert getattr(via_gateway, name) == getattr(via_loop, name), name
    assert generation_spans(via_gateway.response_mask) == generation_spans(via_loop.response_mask)
    assert [c.name for c in via_gateway.tool_calls] == [c.name for c in via_loop.tool_calls]


def test_concurrent_sessions_share_engine_batches(gateway) -> None:
    core, server, engine = gateway
    sessions = [open_session(core, f"g/c{i}", 200, 4) for i in range(6)]
    engine.batches.clear()
    answers: list[str] = []
    threads = [threading.Thread(target=lambda s=s: answers.append(solve(_client(server, s.token), "rl-train-policy", "12+30="))) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == ["42"] * 6
    assert max(engine.batches) > 1  # some round served several sessions in one engine call


def test_stopping_the_gateway_frees_its_port(tokenizer) -> None:
    import socket

    from rl_train.engines.agent import gateway_runs

    engine = Scripted(tokenizer, ["1"])
    engine.tokenizer = tokenizer
    server = gateway_runs.gateway_for(engine)
    assert gateway_runs.gateway_for(engine) is server  # one per engine
    port = server.port
    gateway_runs.stop_gateways()
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
