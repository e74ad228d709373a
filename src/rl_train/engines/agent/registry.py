"""The agent loops a prompt can be answered by (``rollout.agent``): one explicit table.

The loops live in ``loops``; the table names each by import path, so the config checks a
loop's name without importing them (the tool loop brings jsonschema and the tools):

- ``single_turn``: one generation, continued from the response so far (a partial rollout
  resumes where an abort left it); every response token is the model's.
- ``tool_agent``: the multi-turn tool loop (``ToolAgentLoop``); it always starts afresh, since
  a partial trajectory's observations cannot be told from its generated tokens by the engine.
- ``gateway_agent``: a black-box agent's session on the replica's gateway (R-5.5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.engines.agent.loops import AgentLoopFn

Start = tuple[str, list[int], list[int]]
"""(request id, prompt ids, response prefix)."""

FAILED = "failed"
"""The stop reason of a trajectory whose agent failed (crashed, sent no request, overran its
deadline): nothing of it is trained on; its prompt alone is tagged ``failure`` and retried or
refilled as a failed rollout is, while the batch's other prompts keep their trajectories."""

_HOME = "rl_train.engines.agent.loops:"

AGENT_LOOPS: Registry[Entry[AgentLoopFn]] = Registry(
    "agent loop",
    "rollout.agent.default, rollout.agent.by_data_source, a row's agent_name",
    {
        "single_turn": Entry(
            _HOME + "single_turn",
            "one generation per trajectory; an aborted one continues from its tokens under the new weights.",
        ),
        "tool_agent": Entry(
            _HOME + "tool_agent",
            "the multi-turn tool loop; tool calls as JSON in `<tool_call>` tags, answers appended as "
            "`<tool_response>` ids with mask 0; a batch steps together.",
        ),
        "gateway_agent": Entry(
            _HOME + "gateway_agent",
            "a black-box agent (a process group, `gateway_command`, or with `gateway_mode: in_process` a "
            "thread, `gateway_program`) talks to the replica's OpenAI-compatible gateway; its session is "
            "the trajectory.",
        ),
    },
)
