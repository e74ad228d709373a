"""What isolating gateway agents costs: the calculator agent as a sandboxed process, against the
same agent on a thread of the replica (the trusted, in-process opt-in).

One batch of ``--agents`` calculator agents (``examples/calculator_agent.py``, the official
``openai`` client), each solving its sum in two turns through the replica's gateway, against an
engine that answers from a script at once: what is left is the agents' own cost (a process, a
sandbox and an interpreter with ``openai`` imported per agent, against a thread). The two modes
run in turns, ``--repeats`` times each; the bench prints each batch's wall seconds, the medians,
the ratio process / in-process and the extra seconds per agent.

    python -m rl_train.bench.gateway_agents               # 16 agents at once, 3 repeats
    python -m rl_train.bench.gateway_agents --agents 4 --repeats 1
"""

from __future__ import annotations

import argparse
import time
from statistics import median
from typing import Any

CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>'


class ScriptedEngine:
    """Turn one calls the calculator, turn two answers; at once, with no model."""

    def __init__(self) -> None:
        from rl_train.engines.model.tokenizer import build_char_tokenizer

        self.tokenizer, self.version = build_char_tokenizer(), 0

    def generate(self, requests: list[Any], params: Any) -> list[Any]:
        from rl_train.engines.rollout.protocol import GenerationResult

        out = []
        for request in requests:
            text = "42" if self.tokenizer.decode(request.response_prefix).count("</s>") else CALL
            new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            out.append(GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new], [0.0] * len(new), [0] * len(new), "eos"))
        return out


def run_batch(engine: ScriptedEngine, agents: int, in_process: bool) -> float:
    """Wall seconds of one batch of ``agents`` calculator agents, all at once."""
    from rl_train.engines.agent.chat import prompt_ids
    from rl_train.engines.agent.config import AgentConfig
    from rl_train.engines.agent.gateway_runs import run_gateway_agents
    from rl_train.engines.rollout.protocol import SamplingParams

    mode: dict[str, Any] = {"gateway_mode": "in_process", "gateway_program": "rl_train.examples.calculator_agent:run"} if in_process else {}
    cfg = AgentConfig(tool_threads=agents, gateway_timeout_s=120, **mode)
    starts = [(f"b{i}/0", prompt_ids(engine.tokenizer, f"{i}+30=")) for i in range(agents)]
    started = time.perf_counter()
    out = run_gateway_agents(engine, starts, SamplingParams(), cfg)
    seconds = time.perf_counter() - started
    failed = [t.request_id for t in out if t.turns != 2]
    if failed:
        raise RuntimeError(f"agents {failed} did not finish their two turns")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from rl_train.engines.agent.gateway_runs import stop_gateways

    engine = ScriptedEngine()
    walls: dict[str, list[float]] = {"in_process": [], "process": []}
    try:
        run_batch(engine, 1, True)  # warm: the gateway up, openai imported here
        for repeat in range(args.repeats):
            for name in ("in_process", "process") if repeat % 2 == 0 else ("process", "in_process"):
                walls[name].append(run_batch(engine, args.agents, name == "in_process"))
                print(f"repeat {repeat} {name:10s} {walls[name][-1]:.2f} s")
    finally:
        stop_gateways()
    threads, processes = median(walls["in_process"]), median(walls["process"])
    print(f"{args.agents} agents at once, median of {args.repeats}: in-process {threads:.2f} s, sandboxed process {processes:.2f} s")
    print(f"process / in-process: {processes / threads:.2f}x; {(processes - threads) / args.agents:.3f} s more per agent")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
