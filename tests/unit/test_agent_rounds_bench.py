"""The agent-rounds bench splits the engine's time and tokens into first turns and turns after
a tool, counting the context each call prefilled."""

from __future__ import annotations

from typing import Any

from rl_train.bench.agent_rounds import run_batch
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams


class Engine:
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return [
            GenerationResult(r.request_id, r.prompt_ids, [*r.response_prefix, 7, 7, 7], [0.0] * 3, [0] * 3, "eos")
            for r in requests
        ]


class TwoTurns:
    """A loop that generates a first turn for every start, then continues two of them."""

    def __init__(self, engine: Any, limits: Any) -> None:
        self.engine = engine

    def run_batch(self, starts: list[tuple[str, list[int]]], params: SamplingParams) -> None:
        first = self.engine.generate([GenerationRequest(rid, ids) for rid, ids in starts], params)
        self.engine.generate([GenerationRequest(r.request_id, r.prompt_ids, [*r.response_ids, 9]) for r in first[:1]], params)
        self.engine.generate([GenerationRequest(r.request_id, r.prompt_ids, [*r.response_ids, 9]) for r in first[1:2]], params)


def test_first_turns_and_continuations_are_counted_apart() -> None:
    engine = Engine()
    out = run_batch(engine, TwoTurns, None, [("a", [1, 2]), ("b", [1, 2, 3]), ("c", [1])], SamplingParams())
    assert out["calls"] == 3 and out["rows_per_call"] == 5 / 3
    assert out["first_prefilled"] == 6 and out["first_generated"] == 9
    assert out["after_tool_prefilled"] == (2 + 4) + (3 + 4) and out["after_tool_generated"] == 6
    assert out["first_seconds"] >= 0 and out["after_tool_seconds"] >= 0
    assert "generate" not in vars(engine)  # the engine is left as it was


class KeepingEngine(Engine):
    """Reports that it reused each continuation's context but its last token."""

    def __init__(self) -> None:
        self.kept = type("Kept", (), {"reused_tokens": 0})()
        self.resets = 0

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.kept.reused_tokens += sum(len(r.prompt_ids) + len(r.response_prefix) - 1 for r in requests if r.response_prefix)
        return super().generate(requests, params)


def test_context_an_engine_kept_is_not_counted_as_prefilled() -> None:
    engine = KeepingEngine()
    out = run_batch(engine, TwoTurns, None, [("a", [1, 2]), ("b", [1, 2, 3]), ("c", [1])], SamplingParams())
    assert out["first_prefilled"] == 6 and out["after_tool_prefilled"] == 2  # one token a continuation
    assert engine.resets == 1  # nothing kept by an earlier batch is counted as this one's
