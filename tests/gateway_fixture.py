"""What the gateway tests share: a scripted engine, sessions opened for a task as a rollout
replica opens them, and a served gateway that is always stopped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rl_train.engines.agent.gateway import GatewayLimits
from rl_train.engines.agent.gateway_core import GatewayCore, Generate
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.agent.sessions import Session, SessionStore
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams

MODEL = "rl-train-policy"
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>'


class Scripted:
    """An engine whose turns come from a script keyed by the request's prompt text: the same
    prompt gets the same tokens and log-probs, whichever front end asks. It records every
    sampling parameter it was handed."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.version, self.batches = tokenizer, turns, 5, []
        self.keep_kv: list[bool] = []
        self.params: list[SamplingParams] = []
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        with self._lock:
            self.batches.append(len(requests))
            self.keep_kv += [r.keep_kv for r in requests]
            self.params.append(params)
        out = []
        for request in requests:
            turn = self.tokenizer.decode(request.response_prefix).count("</s>")  # turns so far
            text = self.turns[turn] if turn < len(self.turns) else "done"
            new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            room = params.max_new_tokens - len(request.response_prefix)
            new = new[: max(room, 0)]
            logps = [-0.1 * (1 + (i % 7)) for i in range(len(new))]
            reason = "eos" if new and new[-1] == self.tokenizer.eos_token_id else "length"
            out.append(GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new], logps, [self.version] * len(new), reason))
        return out

    def one(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        """``generate`` for a single request: a gateway's ``Generate`` without a batcher."""
        return self.generate([request], params)[0]


def task_ids(tokenizer: Any, task: str) -> list[int]:
    """A task's prompt ids as a rollout replica encodes a prompt: BOS, then the text."""
    return [tokenizer.bos_token_id, *tokenizer.encode(task, add_special_tokens=False)]


def open_session(
    core: GatewayCore, session_id: str, max_response_tokens: int = 200, max_turns: int = 4, task: str = "12+30=", **limits: Any
) -> Session:
    return core.open_session(session_id, max_response_tokens, max_turns, task_ids=task_ids(core.tokenizer, task), **limits)


@contextmanager
def served(
    generate: Generate, tokenizer: Any, limits: GatewayLimits | None = None, requests_per_second: float = 1000
) -> Iterator[tuple[GatewayCore, GatewayServer]]:
    core = GatewayCore(generate, tokenizer, lambda: 5, SessionStore(max_requests_per_second=requests_per_second))
    server = GatewayServer(core, limits=limits).start()
    try:
        yield core, server
    finally:
        server.stop()
