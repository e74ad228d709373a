"""Running black-box agents against a replica's own gateway (the ``gateway_agent`` loop).

The replica serves one gateway for its engine (started on first use, on 127.0.0.1, stopped
with the replica: ``stop_gateways``). For each trajectory it opens a session with the run's
sampling (the agent's own temperature is not the one the policy is trained at, so the session's
wins), gives the agent the gateway's URL, the session's token and the prompt's text, waits for
it, and ends the session: its trajectory is the record. Agents run side by side
(``rollout.agent.tool_threads``), each either a function called on a thread
(``gateway_program``, ``module:function``) or a command run as a process (``gateway_command``).
"""

from __future__ import annotations

import atexit
import importlib
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rl_train.engines.agent.batcher import MicroBatcher
from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.agent.loop import AgentTrajectory
from rl_train.engines.rollout.protocol import SamplingParams

if TYPE_CHECKING:
    from rl_train.engines.agent.config import AgentConfig

_GATEWAYS: dict[int, tuple[GatewayServer, MicroBatcher]] = {}
_LOCK = threading.Lock()


def gateway_for(engine: Any) -> GatewayServer:
    with _LOCK:
        found = _GATEWAYS.get(id(engine))
        if found is None:
            batcher = MicroBatcher(engine)
            server = GatewayServer(GatewayCore(batcher.generate, engine.tokenizer, lambda: engine.version)).start()
            found = _GATEWAYS[id(engine)] = (server, batcher)
        return found[0]


def stop_gateways() -> None:
    """Stop every gateway of this process (its port closed) and its batcher."""
    with _LOCK:
        running = list(_GATEWAYS.values())
        _GATEWAYS.clear()
    for server, batcher in running:
        server.stop()
        batcher.close()


atexit.register(stop_gateways)


def load_program(spec: str) -> Callable[[str, str, str], Any]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"rollout.agent.gateway_program: got {spec!r}; expected module:function")
    return getattr(importlib.import_module(module), name)


def run_gateway_agents(
    engine: Any, starts: list[tuple[str, list[int]]], params: SamplingParams, cfg: AgentConfig
) -> list[AgentTrajectory]:
    server = gateway_for(engine)
    core = server.core
    program = None if cfg.gateway_command else load_program(cfg.gateway_program)
    sampling = {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed}
    for rid, _ in starts:
        core.open_session(rid, cfg.max_response_tokens, cfg.max_turns, sampling)

    def one(start: tuple[str, list[int]]) -> None:
        rid, ids = start
        task = engine.tokenizer.decode(ids, skip_special_tokens=True)
        token = core.store.token_of(rid)
        if program is not None:
            program(server.base_url, token, task)
            return
        command = [part.format(base_url=server.base_url, api_key=token, task=task) for part in cfg.gateway_command]
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=cfg.gateway_timeout_s, check=False)

    errors: dict[str, BaseException] = {}
    with ThreadPoolExecutor(min(cfg.tool_threads, max(len(starts), 1)), thread_name_prefix="gateway-agent") as pool:
        futures = {rid: pool.submit(one, (rid, ids)) for rid, ids in starts}
        for rid, future in futures.items():
            try:
                future.result(timeout=cfg.gateway_timeout_s)
            except Exception as error:  # an agent that fails ends its session as it stands
                errors[rid] = error
    trajectories = [core.end_session(rid) for rid, _ in starts]
    silent = [t.request_id for t in trajectories if not t.prompt_ids]
    if silent:  # nothing to train on: the prompts fail, and the replay buffer retries them
        why = "; ".join(f"{rid}: {errors[rid]!r}" for rid in silent if rid in errors) or "it sent no request"
        raise RuntimeError(f"{len(silent)} gateway agent(s) made no request ({why})")
    return trajectories
