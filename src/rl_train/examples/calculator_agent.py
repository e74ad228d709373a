"""A black-box agent: an ordinary OpenAI-client program that solves a sum with a calculator.

It knows nothing of rl-train. It sends the task as a user message with a ``calculator`` tool,
runs every tool call the model makes with its own calculator, sends the answer back as a tool
message, and stops at the first reply without a tool call, printing it. Pointed at the
gateway (the session's URL and token), its conversation becomes a training trajectory; pointed
at any OpenAI-compatible server, it is just an agent.

It reads where to go and what to do from its environment, as a rollout replica runs it (the
default ``rollout.agent.gateway_command``): ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``RL_TRAIN_TASK``. The key is never taken from the command line, where every user of the host
could read it.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=rlt-... RL_TRAIN_TASK="345+678=" \\
        python -m rl_train.examples.calculator_agent
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
from typing import TYPE_CHECKING

from openai import OpenAI

if TYPE_CHECKING:  # the client's request types; names of recent clients, for the checker only
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
    )

CALCULATOR: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression of integers with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """The agent's own calculator: integers, + - *, parentheses; an error message otherwise."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("unsupported expression")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as error:
        return f"error: {error}"


def solve(client: OpenAI, model: str, task: str, max_turns: int = 4, stream: bool = False, seed: int | None = None) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        content, calls = _ask(client, model, messages, stream, seed)
        reply: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": content or None}
        if calls:
            reply["tool_calls"] = calls
        messages.append(reply)
        if not calls:
            return content
        for call in calls:
            try:
                arguments = json.loads(call["function"]["arguments"])
                answer = calculate(str(arguments.get("expression", "")))
            except (json.JSONDecodeError, AttributeError):
                answer = "error: arguments are not a JSON object"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
    return ""


def _ask(
    client: OpenAI, model: str, messages: list[ChatCompletionMessageParam], stream: bool, seed: int | None
) -> tuple[str, list[ChatCompletionMessageFunctionToolCallParam]]:
    """The assistant's reply, streamed or not: its text and its function calls."""
    if not stream:
        message = client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR], seed=seed).choices[0].message
        called = [c for c in message.tool_calls or [] if c.type == "function"]
        return message.content or "", [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in called
        ]
    content = ""
    calls: dict[int, ChatCompletionMessageFunctionToolCallParam] = {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR], seed=seed, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": call.id or "", "type": "function", "function": {"name": "", "arguments": ""}})
            if call.function is not None:  # a chunk may carry only the call's id
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    return content, [calls[i] for i in sorted(calls)]


def run(base_url: str, api_key: str, task: str) -> str:
    """The agent as a function (``rollout.agent.gateway_mode: in_process``, ``gateway_program``)."""
    return solve(OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120), "rl-train-policy", task)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="rl-train-policy")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    missing = [name for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RL_TRAIN_TASK") if not os.environ.get(name)]
    if missing:
        parser.error(f"set {', '.join(missing)} in the environment (the gateway's URL, the session's key, the task)")
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0, timeout=120)
    print(solve(client, args.model, os.environ["RL_TRAIN_TASK"], args.max_turns, args.stream, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
