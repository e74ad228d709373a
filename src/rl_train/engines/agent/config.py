"""``rollout.agent``: which agent loop answers each prompt, and the tool loop's limits (R-5.4).

A prompt's loop is its row's ``agent_name`` column when it has one, else the loop named for
its ``data_source`` in ``by_data_source`` (the exact name, then its longest prefix before a
'/', as rewards are routed), else ``default``. Names are checked at load against
``AGENT_LOOPS`` (``engines/agent/registry.py``), whose table names the loops by import path.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr, field_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.agent.registry import AGENT_LOOPS
from rl_train.engines.sandbox import SandboxConfig


def check_agent_loop(name: str) -> str:
    """``name`` if it is a registered agent loop, else ``ValueError`` listing the loops."""
    return AGENT_LOOPS.check(name)


class AgentConfig(StrictModel):
    default: str = "single_turn"
    """The agent loop of a prompt that names none: single_turn (one generation), tool_agent (multi-turn tool calls) or gateway_agent (a black-box agent through the OpenAI-compatible gateway)."""
    by_data_source: dict[str, str] = Field(default_factory=dict)
    """Agent loop per data_source (exact name or its longest '/' prefix); a row's agent_name column wins."""
    max_turns: int = Field(4, ge=1)
    """tool_agent: model turns per trajectory (each but the last may call one tool)."""
    max_response_tokens: int = Field(160, ge=1)
    """tool_agent: response tokens per trajectory, generated and observed together."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """tool_agent: longest one tool call may take; a slower one answers with an error observation."""
    tool_latency_median_s: float = Field(0.0, ge=0)
    """tool_agent: median of a heavy-tailed (lognormal) delay added to every tool call, the same for the same trajectory and turn in every mode (0: none); a sandbox's latency, for benchmarks."""
    tool_latency_sigma: float = Field(1.4, ge=0)
    """tool_agent: shape of that delay; p99/p50 = exp(2.326 x sigma) (1.4 gives 26x); a delay past tool_timeout_s is a time-out."""
    batches_in_flight: int = Field(1, ge=1)
    """Agent loops a rollout replica's background generation runs at once, the queued groups shared evenly among them; their engine calls share batches (calls that wait while one runs go together in the next)."""
    tool_threads: int = Field(16, ge=1)
    """tool_agent: tool calls run side by side on this many threads (a call waits for a free one); gateway_agent: agents run at once."""
    gateway_program: str = "rl_train.examples.calculator_agent:run"
    """gateway_agent: the black-box agent, a module:function called as f(base_url, api_key, task) on a thread."""
    gateway_command: list[str] = Field(default_factory=list)
    """gateway_agent: run the agent as this command instead ({base_url}, {api_key}, {task} filled in)."""
    gateway_timeout_s: float = Field(300.0, gt=0)
    """gateway_agent: longest one agent may take; it is then abandoned and its session ends as it stands."""
    gateway_max_prompt_tokens: int = Field(512, ge=1)
    """gateway_agent: a session's prompt (the task's ids, then whatever the agent's first request adds after the task's text) is at most this many tokens; a longer one is refused (400) before it reaches the engine."""
    gateway_max_total_tokens: int | None = Field(None, ge=2)
    """gateway_agent: a session's prompt and response together are at most this many tokens, the response cut short to fit (keep it within the model's context); None: gateway_max_prompt_tokens + max_response_tokens."""

    _sandbox: SandboxConfig = PrivateAttr(default_factory=SandboxConfig)

    @property
    def sandbox(self) -> SandboxConfig:
        """The run's top-level ``sandbox`` section, handed to the loops with this one
        (``with_sandbox``): how the python tool runs its code."""
        return self._sandbox

    def with_sandbox(self, sandbox: SandboxConfig | dict[str, Any] | None) -> AgentConfig:
        """This config, carrying the run's ``sandbox`` section (a dump of it, or None: defaults)."""
        self._sandbox = sandbox if isinstance(sandbox, SandboxConfig) else SandboxConfig.model_validate(sandbox or {})
        return self

    @field_validator("default")
    @classmethod
    def _known_default(cls, name: str) -> str:
        return check_agent_loop(name)

    @field_validator("by_data_source")
    @classmethod
    def _known_routes(cls, routes: dict[str, str]) -> dict[str, str]:
        for source, name in routes.items():
            try:
                check_agent_loop(name)
            except ValueError as error:
                raise ValueError(f"{source}: {error}") from None
        return routes

    def loop_for(self, row: dict[str, Any]) -> str:
        """The agent loop that answers ``row`` (a prompt record)."""
        named = row.get("agent_name")
        if named:
            return check_agent_loop(str(named))
        parts = str(row.get("data_source", "")).split("/")
        for end in range(len(parts), 0, -1):
            routed = self.by_data_source.get("/".join(parts[:end]))
            if routed:
                return routed
        return self.default
