"""``rollout.agent``: which agent loop answers each prompt, and the tool loop's limits (R-5.4).

A prompt's loop is its row's ``agent_name`` column when it has one, else the loop named for
its ``data_source`` in ``by_data_source`` (the exact name, then its longest prefix before a
'/', as rewards are routed), else ``default``. Names are checked at load against
``AGENT_LOOPS`` (``engines/agent/registry.py``), whose table names the loops by import path.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.agent.gateway_modes import GATEWAY_MODES
from rl_train.engines.agent.registry import AGENT_LOOPS
from rl_train.engines.sandbox import SandboxConfig

DEFAULT_GATEWAY_COMMAND = ("{python}", "-m", "rl_train.examples.calculator_agent")
"""The built-in calculator agent, run as a process with the replica's interpreter."""
ARGV_REFUSED = ("base_url", "api_key", "task")
"""Placeholders an agent's command once had: refused, with a pointer to the environment."""


def check_agent_loop(name: str) -> str:
    """``name`` if it is a registered agent loop, else ``ValueError`` listing the loops."""
    return AGENT_LOOPS.check(name)



def _known_gateway_mode(value: str) -> str:
    """A mode of ``GATEWAY_MODES`` (the table holds the names; the config keeps no copy)."""
    try:
        return GATEWAY_MODES.check(value)
    except ValueError as error:
        raise ValueError(f"got {value!r}: {error}") from None

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
    gateway_mode: Annotated[str, AfterValidator(_known_gateway_mode)] = "process"
    """gateway_agent: how an agent runs. process: gateway_command, in a sandbox (the sandbox section) and a process group of its own, killed as a group at gateway_timeout_s plus a grace; in_process: gateway_program on a thread of the replica (trusted code only: a thread cannot be killed, so at the deadline its session is closed and the thread abandoned)."""
    gateway_command: list[str] = Field(default_factory=lambda: list(DEFAULT_GATEWAY_COMMAND))
    """gateway_agent (process): the agent's argv; {python} is the replica's interpreter. The agent reads the gateway's URL from OPENAI_BASE_URL, its session's key from OPENAI_API_KEY and its task from RL_TRAIN_TASK (never argv); the rest of the replica's environment is not passed on but PATH, PYTHONPATH and the locale."""
    gateway_program: str = ""
    """gateway_agent (in_process only): the agent as a module:function, called as f(base_url, api_key, task) on a thread (e.g. rl_train.examples.calculator_agent:run)."""
    gateway_memory_mb: int = Field(2048, ge=64)
    """gateway_agent (process): address space of each of the agent's processes in its sandbox, MiB (RLIMIT_AS); the sandbox section's other limits apply as they are."""
    gateway_timeout_s: float = Field(300.0, gt=0)
    """gateway_agent: longest one agent may take. Its session is then closed (further requests: 410) and a process agent's group is killed a grace later; the agent fails its own prompt, which is retried or refilled like any failed rollout."""
    gateway_max_prompt_tokens: int = Field(512, ge=1)
    """gateway_agent: a session's prompt (the task's ids, then whatever the agent's first request adds after the task's text) is at most this many tokens; a longer one is refused (400) before it reaches the engine."""
    gateway_max_total_tokens: int | None = Field(None, ge=2)
    """gateway_agent: a session's prompt and response together are at most this many tokens, the response cut short to fit (keep it within the model's context); None: gateway_max_prompt_tokens + max_response_tokens."""

    @field_validator("gateway_command")
    @classmethod
    def _no_secrets_on_argv(cls, command: list[str]) -> list[str]:
        if not command:
            raise ValueError("empty; allowed: the agent's argv, e.g. " + " ".join(DEFAULT_GATEWAY_COMMAND))
        for i, part in enumerate(command):
            told = [name for name in ARGV_REFUSED if "{" + name + "}" in part]
            if told:
                raise ValueError(
                    f"[{i}]: got {part!r}; {{{told[0]}}} is no longer filled in: an agent's base URL, key and "
                    "task go by environment (OPENAI_BASE_URL, OPENAI_API_KEY, RL_TRAIN_TASK), never argv, "
                    "which any user of the host can read; allowed placeholder: {python}"
                )
        return command

    @model_validator(mode="after")
    def _one_way_to_run(self) -> AgentConfig:
        if not GATEWAY_MODES[self.gateway_mode].runs_untrusted_program:  # trusted code, gateway_program
            if "gateway_command" in self.model_fields_set:
                raise ValueError(
                    f"gateway_command: got {self.gateway_command!r} with gateway_mode: in_process, which runs "
                    "gateway_program; set one: gateway_mode: process with gateway_command, or in_process with gateway_program"
                )
            module, _, function = self.gateway_program.partition(":")
            if not module or not function:
                raise ValueError(
                    f"gateway_program: got {self.gateway_program!r}; gateway_mode: in_process needs a "
                    "module:function, e.g. rl_train.examples.calculator_agent:run"
                )
        elif self.gateway_program:
            raise ValueError(
                f"gateway_program: got {self.gateway_program!r} with gateway_mode: process; an in-process agent "
                "is an explicit opt-in (gateway_mode: in_process: a thread that cannot be killed at its deadline); "
                "a process agent is gateway_command"
            )
        return self

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
