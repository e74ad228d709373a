"""Running black-box agents against a replica's own gateway (the ``gateway_agent`` loop).

The replica serves one gateway for its engine (started on first use, on 127.0.0.1, stopped
with the replica: ``stop_gateways``). For each trajectory it opens a session with the run's
sampling (the agent's own temperature is not the one the policy is trained at, so the session's
wins), gives the agent the gateway's URL, the session's token and the prompt's text, and ends
the session when the agent ends: its trajectory is the record. Up to
``rollout.agent.tool_threads`` agents run at once, each a process group (``agent_process``) or,
as an explicit opt-in, a function on a thread (``agent_threads``).

One supervisor loop on the caller's thread watches them all and waits on none. An agent has
``gateway_timeout_s``: then its session is closed (its further requests get 410) and, ``GRACE_S``
later, a process agent's group is killed (a thread is abandoned). The rollout's ``stop`` kills
every agent at once and ends their trajectories ``aborted``. An agent that fails (a non-zero
exit, an exception, no request at all, its deadline) ends its trajectory ``FAILED``: its prompt
alone is retried or refilled (``rollout_batch``), and the others keep their trajectories. Every
session opened is closed, whatever happens (``finally``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rl_train.engines.agent.agent_process import AgentProcess, agent_env, agent_limits, start_agent
from rl_train.engines.agent.agent_threads import AgentThread, Program, StuckThreadsError, load_program
from rl_train.engines.agent.batcher import MicroBatcher
from rl_train.engines.agent.gateway_core import GatewayCore
from rl_train.engines.agent.gateway_modes import GATEWAY_MODES
from rl_train.engines.agent.gateway_server import GatewayServer
from rl_train.engines.agent.loop import AgentState, AgentTrajectory
from rl_train.engines.agent.registry import FAILED
from rl_train.engines.agent.sessions import SessionError
from rl_train.engines.rollout.protocol import SamplingParams

if TYPE_CHECKING:
    from rl_train.engines.agent.config import AgentConfig

logger = logging.getLogger(__name__)

GRACE_S = 1.0
"""How long after its deadline (its session closed) a process agent may take to exit before its
group is killed."""
_POLL_S = 0.02

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


class _ProcessAgent:
    """A running agent process as the supervisor sees it."""

    grace_s = GRACE_S
    at_deadline = "its process group was killed"

    def __init__(self, process: AgentProcess) -> None:
        self.process = process

    def outcome(self) -> str | None:
        """None while it runs; "" for a clean exit; else why it failed."""
        code = self.process.wait(0)
        if code is None:
            return None
        return "" if code == 0 else f"exit code {code}; stderr ends: {self.process.stderr_tail()[-400:]!r}"

    def end(self) -> None:
        """Kill what is left of its group and reap it."""
        self.process.__exit__(None, None, None)


class _ThreadAgent:
    """A running in-process agent: nothing to wait for past its deadline, since it cannot be killed."""

    grace_s = 0.0
    at_deadline = "its thread was abandoned (a thread cannot be killed)"

    def __init__(self, thread: AgentThread) -> None:
        self.thread = thread

    def outcome(self) -> str | None:
        if not self.thread.done():
            return None
        return "" if self.thread.error is None else f"raised {self.thread.error!r}"

    def end(self) -> None:
        self.thread.abandon()


@dataclass
class _Running:
    agent: _ProcessAgent | _ThreadAgent
    ids: list[int]
    deadline: float
    """gateway_timeout_s after its start: its session closes."""
    overdue: bool = False


class GatewayBatch:
    """One batch of gateway agents on one replica's gateway (see the module's docstring)."""

    def __init__(
        self,
        server: GatewayServer,
        tokenizer: Any,
        params: SamplingParams,
        cfg: AgentConfig,
        stop: threading.Event | None,
    ) -> None:
        self.server, self.core, self.tokenizer, self.cfg, self.stop = server, server.core, tokenizer, cfg, stop
        self.allow_unsandboxed = cfg.sandbox.allow_unsandboxed
        """The run's ``sandbox.allow_unsandboxed`` (``AgentConfig.with_sandbox``)."""
        self.limits = agent_limits(cfg.gateway_timeout_s, GRACE_S, cfg.gateway_memory_mb)
        self.sampling = {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed}
        self.launch: Callable[[str, str, str], _ProcessAgent | _ThreadAgent] = GATEWAY_MODES.get(cfg.gateway_mode)(self)
        """(request id, session token, task) -> a running agent: the mode's launcher, chosen once."""
        self.running: dict[str, _Running] = {}
        self.ended: dict[str, AgentTrajectory] = {}

    def run(self, starts: list[tuple[str, list[int]]]) -> list[AgentTrajectory]:
        queue = deque(starts)
        try:
            while queue or self.running:
                if self.stop is not None and self.stop.is_set():
                    self._abort(queue)
                    break
                while queue and len(self.running) < self.cfg.tool_threads:
                    self._start(*queue.popleft())
                self._watch()
                if self.stop is not None:
                    self.stop.wait(_POLL_S)
                else:
                    time.sleep(_POLL_S)
        finally:  # an error of the trainer's own (a start that failed): no agent or session outlives it
            for rid in list(self.running):
                self._fail(rid, "aborted", "the batch ended with an error")
        return [self.ended[rid] for rid, _ in starts]

    def _process_agent(self, rid: str, token: str, task: str) -> _ProcessAgent:
        argv = [part.replace("{python}", sys.executable) for part in self.cfg.gateway_command]
        env = agent_env(self.server.base_url, token, task)  # the sandbox's 127.0.0.1:port is the gateway
        gateway = (self.server.host, self.server.port)
        return _ProcessAgent(start_agent(argv, env, self.limits, gateway, self.allow_unsandboxed))

    def _thread_agent(self, program: Program) -> Callable[[str, str, str], _ThreadAgent]:
        def launch(rid: str, token: str, task: str) -> _ThreadAgent:
            return _ThreadAgent(AgentThread(program, self.server.base_url, token, task, f"gateway-agent-{rid}"))

        return launch

    def _start(self, rid: str, ids: list[int]) -> None:
        task = self.tokenizer.decode(ids, skip_special_tokens=True)
        session = self.core.open_session(
            rid, self.cfg.max_response_tokens, self.cfg.max_turns, self.sampling, task_ids=list(ids),
            max_prompt_tokens=self.cfg.gateway_max_prompt_tokens, max_total_tokens=self.cfg.gateway_max_total_tokens,
        )  # fmt: skip
        try:
            agent = self.launch(rid, session.token, task)
        except StuckThreadsError as error:
            self._close(rid)
            self.ended[rid] = self._unfinished(rid, ids, FAILED, str(error))
            return
        except BaseException:
            self._close(rid)
            raise
        self.running[rid] = _Running(agent, ids, time.monotonic() + self.cfg.gateway_timeout_s)

    def _watch(self) -> None:
        """End the agents that exited; close the sessions of those past their deadline, and
        kill (or abandon) those past it by their grace."""
        now = time.monotonic()
        for rid, run in list(self.running.items()):
            why = run.agent.outcome()
            late = f"over its {self.cfg.gateway_timeout_s:g} s (rollout.agent.gateway_timeout_s)"
            if why is not None:
                if run.overdue or why:
                    self._fail(rid, FAILED, late if run.overdue else why)
                else:
                    self._succeed(rid)
            elif now >= run.deadline + run.agent.grace_s:
                self._fail(rid, FAILED, f"{late}; {run.agent.at_deadline}")
            elif now >= run.deadline and not run.overdue:
                run.overdue = True
                self._close(rid)  # its requests get 410 from now on

    def _succeed(self, rid: str) -> None:
        run = self.running.pop(rid)
        run.agent.end()
        trajectory = self.core.end_session(rid)
        if not trajectory.prompt_ids:
            self.ended[rid] = self._unfinished(rid, run.ids, FAILED, "it exited without sending a request")
            return
        self.ended[rid] = trajectory

    def _fail(self, rid: str, stop_reason: str, why: str) -> None:
        run = self.running.pop(rid)
        run.agent.end()
        self._close(rid)
        self.ended[rid] = self._unfinished(rid, run.ids, stop_reason, why)

    def _abort(self, queue: deque[tuple[str, list[int]]]) -> None:
        """The rollout's stop: every agent killed, every trajectory ``aborted``."""
        for rid in list(self.running):
            self._fail(rid, "aborted", "the rollout stopped")
        while queue:
            rid, ids = queue.popleft()
            self.ended[rid] = self._unfinished(rid, ids, "aborted", "")

    def _close(self, rid: str) -> None:
        """Close the session without waiting for a request still in flight (its answer is lost)."""
        with contextlib.suppress(SessionError):  # closed already: past its deadline
            self.core.store.close(rid)

    @staticmethod
    def _unfinished(rid: str, ids: list[int], stop_reason: str, why: str) -> AgentTrajectory:
        """The trajectory of an agent that did not finish: nothing to train on."""
        if stop_reason == FAILED:
            logger.warning("gateway agent %s failed (its prompt is retried or refilled): %s", rid, why)
        return AgentTrajectory(rid, list(ids), stop_reason=stop_reason, states=[AgentState.PENDING, AgentState.TERMINATED])


def run_gateway_agents(
    engine: Any,
    starts: list[tuple[str, list[int]]],
    params: SamplingParams,
    cfg: AgentConfig,
    stop: threading.Event | None = None,
) -> list[AgentTrajectory]:
    """One trajectory per start, in order: the agent's session, or a ``FAILED`` or ``aborted`` one."""
    return GatewayBatch(gateway_for(engine), engine.tokenizer, params, cfg, stop).run(starts)


def process_launcher(runs: GatewayBatch) -> Callable[[str, str, str], _ProcessAgent]:
    """``gateway_mode: process``: each agent is ``gateway_command`` in the sandbox (``GATEWAY_MODES``)."""
    return runs._process_agent


def thread_launcher(runs: GatewayBatch) -> Callable[[str, str, str], _ThreadAgent]:
    """``gateway_mode: in_process``: each agent is ``gateway_program`` on a thread (``GATEWAY_MODES``)."""
    return runs._thread_agent(load_program(runs.cfg.gateway_program))
