"""The agent loops of the ``AGENT_LOOPS`` table (``registry``): one function per loop.

A loop takes the rollout engine, the starts of a batch of trajectories (request id, prompt
ids, the response so far) and sampling parameters, and returns one ``AgentTrajectory`` per
start, in order. As with the engine's own results, ``response_ids`` is the whole response and
the per-token lists (log-probs, versions, the mask) cover what this call added after the
prefix.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rl_train.engines.agent.loop import AgentLimits, AgentState, AgentTrajectory, ToolAgentLoop
from rl_train.engines.agent.registry import Start
from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from rl_train.engines.agent.config import AgentConfig
    from rl_train.engines.rollout.protocol import RolloutEngine

OnDone = Callable[[AgentTrajectory], None]
Admit = Callable[[], list[Start]]
AgentLoopFn = Callable[
    [
        "RolloutEngine", list[Start], SamplingParams, "AgentConfig", "threading.Event | None", "OnDone | None",
        "Admit | None",
    ],
    list[AgentTrajectory],
]  # fmt: skip
"""(engine, starts, sampling, ``rollout.agent``, stop, on_done, admit) -> trajectories. ``stop``
is set while the replica is held (the end of a run): a loop ends what it still has in flight as
``aborted``. A loop may call ``on_done`` with a trajectory as soon as it has ended (the tool
loop does), so that its caller need not wait for the batch's slowest one; every trajectory
is returned at the end either way. A loop that waits between rounds (the tool loop) may call
``admit`` then for more starts, queued meanwhile: they join the batch and are returned with it."""


def single_turn(
    engine: RolloutEngine,
    starts: list[Start],
    params: SamplingParams,
    cfg: AgentConfig,
    stop: threading.Event | None = None,
    on_done: OnDone | None = None,
    admit: Admit | None = None,
) -> list[AgentTrajectory]:
    """One engine batch: every trajectory ends with it (``on_done`` and ``admit`` have nothing to add)."""
    requests = [GenerationRequest(rid, ids, response_prefix=list(prefix)) for rid, ids, prefix in starts]
    states = [AgentState.PENDING, AgentState.GENERATING, AgentState.TERMINATED]
    return [
        AgentTrajectory(
            rid, list(ids), list(result.response_ids), [], list(result.log_probs), list(result.token_versions),
            turns=1, stop_reason=result.stop_reason, states=list(states), routes=result.routes,
        )  # fmt: skip
        for (rid, ids, _), result in zip(starts, engine.generate(requests, params) if requests else [], strict=True)
    ]


def tool_agent(
    engine: RolloutEngine,
    starts: list[Start],
    params: SamplingParams,
    cfg: AgentConfig,
    stop: threading.Event | None = None,
    on_done: OnDone | None = None,
    admit: Admit | None = None,
) -> list[AgentTrajectory]:
    limits = AgentLimits(
        cfg.max_turns, cfg.max_response_tokens, cfg.tool_timeout_s, cfg.tool_latency_median_s, cfg.tool_latency_sigma,
        cfg.sandbox,
    )  # fmt: skip
    loop = ToolAgentLoop(engine, limits, cfg.tool_threads)
    more = None if admit is None else (lambda: [(rid, ids) for rid, ids, _ in admit()])
    return loop.run_batch([(rid, ids) for rid, ids, _ in starts], params, stop, on_done, more)


def gateway_agent(
    engine: RolloutEngine,
    starts: list[Start],
    params: SamplingParams,
    cfg: AgentConfig,
    stop: threading.Event | None = None,
    on_done: OnDone | None = None,
    admit: Admit | None = None,
) -> list[AgentTrajectory]:
    """Each trajectory is a black-box agent's session on this replica's gateway (R-5.5)."""
    from rl_train.engines.agent.gateway_runs import run_gateway_agents

    return run_gateway_agents(engine, [(rid, ids) for rid, ids, _ in starts], params, cfg, stop)
