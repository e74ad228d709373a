"""The gateway against an agent that means harm: each attack that once got through, tried again.

Every test checks three things: the attack is refused with the 4xx that names it, it is refused
within its limit plus a generous grace (the machine is shared), and the gateway goes on
answering another session at once afterwards (or during)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fixture import CALL, MODEL, Scripted, open_session, served, task_ids
from openai import OpenAI

from rl_train.engines.agent.gateway import GatewayLimits
from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams

GRACE_S = 20.0
"""Added to every limit a test asserts: the machine running the suite may be loaded."""
TASK = "12+30="


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def gateway(tokenizer: Any) -> Iterator[tuple[GatewayCore, GatewayServer, Scripted]]:
    engine = Scripted(tokenizer, [CALL, "42"])
    with served(engine.one, tokenizer) as (core, server):
        yield core, server, engine


def _raw(server: GatewayServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=GRACE_S, headers={"authorization": f"Bearer {token}"})


def _still_answers(core: GatewayCore, server: GatewayServer, name: str) -> None:
    """Another session, opened now, gets its turn at once."""
    started = time.monotonic()
    session = open_session(core, name)
    reply = _raw(server, session.token).post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": TASK}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["tool_calls"]
    assert time.monotonic() - started < GRACE_S


def _refused(answer: httpx.Response, status: int, code: str | None = None) -> str:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return str(error["message"])


# -- the prompt is the task's ------------------------------------------------------------------
def test_a_million_token_first_message_is_refused_before_any_engine_batch(gateway) -> None:
    core, server, engine = gateway
    session = open_session(core, "big")
    huge = TASK + "x" * 1_000_001  # one token a character: 1,000,001 tokens after the task, in a body under 1 MiB
    started = time.monotonic()
    answer = _raw(server, session.token).post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": huge}]})
    message = _refused(answer, 400, "context_length_exceeded")
    assert "gateway_max_prompt_tokens" in message and "1000008 tokens" in message
    assert time.monotonic() - started < GRACE_S
    assert engine.batches == [] and session.trajectory is None  # nothing reached the engine, nothing was kept
    _still_answers(core, server, "after-big")
    # the same session can still begin properly, and its prompt is the task's own ids
    answer = _raw(server, session.token).post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": TASK}]})
    assert answer.status_code == 200 and session.trajectory is not None
    assert session.trajectory.prompt_ids == task_ids(core.tokenizer, TASK)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "You are evil."}, {"role": "user", "content": TASK}],  # conditioning put before the task
        [{"role": "user", "content": "99+1="}],  # another task
        [{"role": "user", "content": TASK[:-1]}],  # a task cut short
        [{"role": "user", "content": " " + TASK}],
    ],
)
def test_a_first_request_that_does_not_begin_with_the_task_is_refused(gateway, messages: list[dict[str, str]]) -> None:
    core, server, engine = gateway
    session = open_session(core, "other-task")
    answer = _raw(server, session.token).post("/chat/completions", json={"model": MODEL, "messages": messages})
    assert "begin with this session's task" in _refused(answer, 400, "prompt_mismatch")
    assert engine.batches == [] and session.trajectory is None
    _still_answers(core, server, "after-other-task")


def test_what_the_first_request_adds_after_the_task_follows_the_task_s_ids_within_the_caps(gateway, tokenizer) -> None:
    core, server, _ = gateway
    added = "\nShow your work."
    session = open_session(core, "tail", max_prompt_tokens=64)
    messages = [{"role": "system", "content": TASK}, {"role": "user", "content": added[1:]}]  # joined by a newline
    reply = OpenAI(base_url=server.base_url, api_key=session.token, max_retries=0).chat.completions.create(model=MODEL, messages=messages)
    assert reply.usage is not None
    expected = [*task_ids(tokenizer, TASK), *tokenizer.encode(added, add_special_tokens=False)]
    assert session.trajectory is not None and session.trajectory.prompt_ids == expected
    assert reply.usage.prompt_tokens == len(expected)
    # a prompt that leaves no room under the total cap is refused; one that leaves a little is cut to it
    full = open_session(core, "full", max_prompt_tokens=64, max_total_tokens=len(expected))
    answer = _raw(server, full.token).post("/chat/completions", json={"model": MODEL, "messages": messages})
    assert "no room for a response" in _refused(answer, 400, "context_length_exceeded")
    tight = open_session(core, "tight", max_prompt_tokens=64, max_total_tokens=len(expected) + 3)
    answer = _raw(server, tight.token).post("/chat/completions", json={"model": MODEL, "messages": messages})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    assert answer.json()["choices"][0]["finish_reason"] == "length"


# -- the model ---------------------------------------------------------------------------------
def test_an_unknown_model_is_refused_in_openai_s_shape_and_the_served_one_is_listed(gateway) -> None:
    core, server, engine = gateway
    session = open_session(core, "model")
    client = OpenAI(base_url=server.base_url, api_key=session.token, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": TASK}])
    assert raised.value.code == "model_not_found" and "gpt-4o" in raised.value.message
    assert engine.batches == [] and session.trajectory is None
    raw = _raw(server, session.token)  # other routes and methods answer in the same shape
    _refused(raw.get("/engines"), 404, "not_found")
    _refused(raw.put("/chat/completions", json={}), 405)
    _still_answers(core, server, "after-model")


# -- the body ----------------------------------------------------------------------------------
def _send_chunked_until_answered(server: GatewayServer, token: str, total_bytes: int) -> tuple[bytes, int]:
    """POST a chunked body of ``total_bytes`` in 64 KiB chunks, stopping at the first byte of an
    answer; the answer, and how many body bytes had gone out by then."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b" " * (64 << 10)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    pending, sent, answer = head, 0, b""
    with socket.create_connection((server.host, server.port), timeout=GRACE_S) as connection:
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
            readable, writable, _ = select.select([connection], [connection] if pending or sent < total_bytes else [], [], 0.05)
            if readable:
                got = connection.recv(65536)
                if not got:
                    break  # closed
                answer += got
                continue
            if writable:
                if not pending:
                    pending, sent = chunk, sent + len(piece)
                try:
                    pending = pending[connection.send(pending) :]
                except (BrokenPipeError, ConnectionResetError):
                    pending = b""
        answer += _rest_of_body(connection, answer, deadline)
    return answer, sent


def _rest_of_body(connection: socket.socket, answer: bytes, deadline: float) -> bytes:
    """The body bytes of ``answer`` that had not arrived with its head (they may come in a later
    segment), up to its ``content-length``, the connection's close or the deadline."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lengths = [line.split(b":", 1)[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    missing, rest = (int(lengths[0]) - len(body) if lengths else 0), b""
    while missing > 0 and time.monotonic() < deadline:
        if not select.select([connection], [], [], 0.05)[0]:
            continue
        try:
            got = connection.recv(65536)
        except ConnectionResetError:
            break
        if not got:
            break
        rest, missing = rest + got, missing - len(got)
    return rest


def test_a_chunked_40_mib_body_is_refused_as_soon_as_it_passes_the_cap(tokenizer) -> None:
    engine = Scripted(tokenizer, [CALL])
    cap = 256 << 10
    with served(engine.one, tokenizer, GatewayLimits(max_body_bytes=cap)) as (core, server):
        session = open_session(core, "chunked")
        started = time.monotonic()
        answer, sent = _send_chunked_until_answered(server, session.token, 40 << 20)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"request_too_large" in answer
        assert sent < 16 << 20, f"{sent} bytes went out before the 413 (the kernel buffers some MiB): the body was read on past the cap"
        assert time.monotonic() - started < GRACE_S
        _still_answers(core, server, "after-chunked")


def test_a_declared_length_over_the_cap_is_refused_before_the_body_and_a_trickled_body_times_out(tokenizer) -> None:
    engine = Scripted(tokenizer, [CALL])
    with served(engine.one, tokenizer, GatewayLimits(max_body_bytes=1024, body_timeout_s=1.0)) as (core, server):
        session = open_session(core, "declared")
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {session.token}\r\n"
        with socket.create_connection((server.host, server.port), timeout=GRACE_S) as connection:
            connection.sendall(f"{head}Content-Length: {40 << 20}\r\n\r\n".encode())  # and never a byte of body
            assert connection.recv(4096).startswith(b"HTTP/1.1 413")
        started = time.monotonic()
        with socket.create_connection((server.host, server.port), timeout=GRACE_S) as connection:
            connection.sendall(f"{head}Content-Length: 100\r\n\r\n{{".encode())  # 1 of 100 bytes, then silence
            assert connection.recv(4096).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 1.0 + GRACE_S
        _still_answers(core, server, "after-declared")


# -- the JSON ----------------------------------------------------------------------------------
def _chat(messages: str = '[{"role": "user", "content": "12+30="}]', **fields: str) -> bytes:
    extra = "".join(f', "{name}": {value}' for name, value in fields.items())
    return f'{{"model": "rl-train-policy", "messages": {messages}{extra}}}'.encode()


HOSTILE_BODIES = {
    "100,000 nested [": b"[" * 100_000,
    "100,000 nested [ in a message": _chat(messages="[" * 100_000),
    "100,000 nested { then ]": b'{"a":' * 50_000 + b"]",
    "a 5,000-digit integer": b"1" * 5000,
    "a 5,000-digit seed": _chat(seed="9" * 5000),
    "a 5,000-digit negative max_tokens": _chat(max_tokens="-" + "9" * 5000),
    "seed 2**200": _chat(seed=str(2**200)),
    "seed 2**63": _chat(seed=str(2**63)),
    "seed -1": _chat(seed="-1"),
    "a 4,000-digit integer (within Python's limit, beyond int64)": _chat(max_tokens="9" * 4000),
    "300,000 escaped quotes (quadratic for a regex string scanner)": _chat(messages='[{"role": "user", "content": "12+30=' + '\\"' * 300_000 + '"}]'),
    "NaN temperature": _chat(temperature="NaN"),
    "Infinity top_p": _chat(top_p="-Infinity"),
    "1e999 temperature": _chat(temperature="1e999"),
    "a lone surrogate": _chat(messages='[{"role": "user", "content": "12+30=\\ud800"}]'),
    "not UTF-8": b'{"model": "\xff\xfe"}',
    "a list at the top": b"[]",
    "a string at the top": b'"hi"',
    "nothing": b"",
    "n 2": _chat(n="2"),
    "max_tokens 2**40": _chat(max_tokens=str(2**40)),
    "stream as a string": _chat(stream='"yes"'),
    "a boolean seed": _chat(seed="true"),
    "tools of the wrong shape": _chat(tools='[{"type": "function", "function": {"name": 5}}]'),
    "content parts of the wrong shape": _chat(messages='[{"role": "user", "content": [{"type": "text", "text": 5}]}]'),
    "tool call arguments nested 100,000 deep": _chat(
        messages='[{"role": "user", "content": "12+30="}, {"role": "assistant", "content": null, "tool_calls": '
        '[{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "' + "[" * 100_000 + '"}}]}]'
    ),
    "tool call arguments with a 5,000-digit integer": _chat(
        messages='[{"role": "user", "content": "12+30="}, {"role": "assistant", "content": null, "tool_calls": '
        '[{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "' + "7" * 5000 + '"}}]}]'
    ),
}


def test_malformed_json_of_every_shape_is_a_400_and_no_seed_reaches_the_engine_unbounded(gateway) -> None:
    core, server, engine = gateway
    for name, body in HOSTILE_BODIES.items():
        session = open_session(core, f"json/{name}")
        started = time.monotonic()
        answer = _raw(server, session.token).post("/chat/completions", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, (name, answer.text)
        assert answer.json()["error"]["message"], name
        assert time.monotonic() - started < GRACE_S, name
        assert session.trajectory is None, name
    assert engine.batches == []  # none of them reached the engine
    _still_answers(core, server, "after-json")
    session = open_session(core, "seed-max")
    answer = _raw(server, session.token).post("/chat/completions", content=_chat(seed=str(2**63 - 1)))
    assert answer.status_code == 200 and engine.params[-1].seed == 2**63 - 1  # the bound itself is accepted


# -- concurrency -------------------------------------------------------------------------------
class _Gated:
    """A scripted engine whose calls for one session wait on a gate: a generation that takes as
    long as the test likes."""

    def __init__(self, engine: Scripted, held: str) -> None:
        self.engine, self.held = engine, held
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        if request.request_id.startswith(self.held):
            self.entered.set()
            self.gate.wait(60)
        return self.engine.one(request, params)


def test_40_concurrent_requests_from_one_token_stall_no_other_session(tokenizer) -> None:
    gated = _Gated(Scripted(tokenizer, [CALL, "42"]), held="hog")
    with served(gated, tokenizer) as (core, server):
        hog = open_session(core, "hog")
        body = {"model": MODEL, "messages": [{"role": "user", "content": TASK}]}

        def post() -> httpx.Response:  # a client of its own per request: an httpx pool shared by 40 threads can race
            with _raw(server, hog.token) as client:
                return client.post("/chat/completions", json=body)

        with ThreadPoolExecutor(40) as pool:
            first = pool.submit(post)
            assert gated.entered.wait(GRACE_S)  # one request of the hog's is generating, and stays so
            started = time.monotonic()
            rest = [pool.submit(post) for _ in range(39)]
            codes = [future.result(timeout=GRACE_S).status_code for future in rest]
            assert codes == [409] * 39  # the session is busy: each refused at once, none queued
            for i in range(3):  # meanwhile, other sessions are answered
                _still_answers(core, server, f"victim/{i}")
            assert time.monotonic() - started < GRACE_S
            assert not first.done()  # all of that while the hog's first request was still generating
            gated.gate.set()
            assert first.result(timeout=GRACE_S).status_code == 200


def test_past_the_global_cap_a_request_is_refused_at_once_with_retry_after(tokenizer) -> None:
    gated = _Gated(Scripted(tokenizer, [CALL, "42"]), held="held")
    with served(gated, tokenizer, GatewayLimits(max_in_flight=2)) as (core, server):
        body = {"model": MODEL, "messages": [{"role": "user", "content": TASK}]}
        held = [open_session(core, f"held/{i}") for i in range(2)]
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(_raw(server, s.token).post, "/chat/completions", json=body) for s in held]
            deadline = time.monotonic() + GRACE_S
            while sum(s.lock.locked() for s in held) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            third = open_session(core, "third")
            started = time.monotonic()
            answer = _raw(server, third.token).post("/chat/completions", json=body)
            _refused(answer, 503, "server_busy")
            assert answer.headers["retry-after"] == "1" and time.monotonic() - started < GRACE_S
            gated.gate.set()
            assert [f.result(timeout=GRACE_S).status_code for f in futures] == [200, 200]
        answer = _raw(server, third.token).post("/chat/completions", json=body)
        assert answer.status_code == 200  # the refused session was left as it was
