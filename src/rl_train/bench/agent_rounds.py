"""Where a multi-turn batch's rollout time goes: the first turns against the turns after a tool.

Runs the multi-turn tool agent loop of the built-in tool task (``configs/tool-tiny.yaml``'s
policy, prompts, turn and token limits) on one batch, in one process, on one core, the way a
rollout replica runs it: with every tool call delayed by the bench's heavy-tailed latency, and
the same batch with no delay (every answer at once: one engine batch per turn), in turns. For
each it prints the engine calls, requests per call, and the engine's busy seconds split into
first turns and continuations (a continuation's context is the prompt, the turns so far and
the tool's answer), with the tokens generated and the context tokens prefilled by each. Each
side runs twice, on two engines in turns: one that keeps a trajectory's keys and values between
its turns (``rollout.keep_kv_mib``, the default: a continuation prefills the tool's answer
only) and one that keeps none (``keep_kv_mib=0``: it prefills the whole context again).

    python -m rl_train.bench.agent_rounds                 # 8 prompts x 8 samples, 5 rounds
    python -m rl_train.bench.agent_rounds --prompts 32 --median-seconds 0.2
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def _reused(engine: Any) -> int:
    """Context tokens the engine's kept keys and values have spared it prefilling, so far."""
    return int(getattr(getattr(engine, "kept", None), "reused_tokens", 0))


def run_batch(engine: Any, loop_cls: Any, limits: Any, starts: list[tuple[str, list[int]]], params: Any) -> dict[str, float]:
    calls: list[tuple[bool, int, int, int, float]] = []  # continuation, rows, prefilled, generated, seconds
    generate = engine.generate

    def timed(requests: list[Any], sampling: Any) -> list[Any]:
        reused = _reused(engine)
        started = time.perf_counter()
        results = generate(requests, sampling)
        seconds = time.perf_counter() - started
        prefilled = sum(len(r.prompt_ids) + len(r.response_prefix) for r in requests) - (_reused(engine) - reused)
        generated = sum(len(res.response_ids) - len(req.response_prefix) for req, res in zip(requests, results, strict=True))
        continuation = any(r.response_prefix for r in requests)
        calls.append((continuation, len(requests), prefilled, generated, seconds))
        return results

    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()  # the sides share trajectory ids: nothing kept crosses from one to another
    own = "generate" in vars(engine)
    engine.generate = timed
    try:
        started = time.perf_counter()
        loop_cls(engine, limits).run_batch(starts, params)
        wall = time.perf_counter() - started
    finally:
        if own:
            engine.generate = generate
        else:
            del engine.generate
    out = {"wall": wall, "calls": float(len(calls)), "rows_per_call": sum(c[1] for c in calls) / max(len(calls), 1)}
    for name, continuation in (("first", False), ("after_tool", True)):
        mine = [c for c in calls if c[0] == continuation]
        out[f"{name}_seconds"] = sum(c[4] for c in mine)
        out[f"{name}_prefilled"] = float(sum(c[2] for c in mine))
        out[f"{name}_generated"] = float(sum(c[3] for c in mine))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tool-tiny.yaml"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--median-seconds", type=float, default=0.1, help="tool latency p50")
    parser.add_argument("--sigma", type=float, default=1.4)
    parser.add_argument("--rounds", type=int, default=5, help="batches per side, the sides in turns")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a replica's share)")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    import torch

    from rl_train.config import load_config
    from rl_train.engines.agent.loop import AgentLimits, ToolAgentLoop
    from rl_train.engines.rollout.protocol import SamplingParams
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [])
    os.chdir(REPO)  # the config's paths are the repository's
    engines = {
        "kept KV": TorchRolloutEngine(cfg.model.path, seed=cfg.run.seed),
        "re-prefill": TorchRolloutEngine(cfg.model.path, seed=cfg.run.seed, keep_kv_mib=0),
    }
    engine = engines["kept KV"]
    rows = pq.read_table(Path(cfg.data.data_dir) / "train.parquet").to_pylist()
    agent = cfg.rollout.agent
    params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    sides: dict[tuple[str, str], list[dict[str, float]]] = {
        (side, kind): [] for side in ("tool tail", "no delay") for kind in engines
    }
    for round_ in range(args.rounds):
        chosen = rows[(round_ * args.prompts) % len(rows) :][: args.prompts]
        bos = [engine.tokenizer.bos_token_id]
        starts = [
            (f"r{round_}-{i}/{j}", bos + engine.tokenizer.encode(row["prompt"], add_special_tokens=False))
            for i, row in enumerate(chosen)
            for j in range(args.n)
        ]
        order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        for side, kind in order:
            latency = args.median_seconds if side == "tool tail" else 0.0
            limits = AgentLimits(agent.max_turns, agent.max_response_tokens, agent.tool_timeout_s, latency, args.sigma)
            sides[(side, kind)].append(run_batch(engines[kind], ToolAgentLoop, limits, starts, params))
    print(f"{args.prompts} prompts x {args.n} samples, {args.rounds} rounds a side, medians; {args.threads} thread(s)")
    print("| side | engine | wall s | engine calls | requests / call | first turns s | after a tool s | tokens generated (first / after) | context tokens prefilled (first / after) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (side, kind), runs in sides.items():
        m = {key: median(r[key] for r in runs) for key in runs[0]}
        print(
            f"| {side} | {kind} | {m['wall']:.2f} | {m['calls']:.0f} | {m['rows_per_call']:.1f} | {m['first_seconds']:.3f} "
            f"| {m['after_tool_seconds']:.3f} | {m['first_generated']:.0f} / {m['after_tool_generated']:.0f} "
            f"| {m['first_prefilled']:.0f} / {m['after_tool_prefilled']:.0f} |"
        )
    for side in ("tool tail", "no delay"):
        kept, again = sides[(side, "kept KV")], sides[(side, "re-prefill")]
        after = [k["after_tool_seconds"] / a["after_tool_seconds"] for k, a in zip(kept, again, strict=True) if a["after_tool_seconds"] > 0]
        total = [
            (k["first_seconds"] + k["after_tool_seconds"]) / (a["first_seconds"] + a["after_tool_seconds"])
            for k, a in zip(kept, again, strict=True)
        ]
        if after:
            print(
                f"{side}: kept KV / re-prefill, medians of the rounds' ratios: turns after a tool {median(after):.2f}x "
                f"the engine time, all turns {median(total):.2f}x"
            )
        else:
            print(f"{side}: no turn followed a tool call (max_turns 1, or no call parsed)")
    tail, flat = (median(r["after_tool_seconds"] for r in sides[(s, "kept KV")]) for s in ("tool tail", "no delay"))
    if flat > 0:
        print(f"turns after a tool, kept KV: {tail / flat:.2f}x the engine time with the tail as with every answer at once")


if __name__ == "__main__":
    main()
