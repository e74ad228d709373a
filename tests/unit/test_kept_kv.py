"""Keys and values kept between a trajectory's turns (``engines/rollout/kept_kv.py``): a turn
that continues them samples what a full prefill would, and they are used only where they are
exactly right (same tokens, same weights)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from rl_train.engines.rollout.kept_kv import KeptEntry, KeptGroup, KeptKV, spans_index
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

TOLERANCE = 1e-4
"""Log-probs of a continuation from kept keys against a full prefill: the same kernels on the
same numbers in other batch shapes, so float rounding apart (measured: up to 2e-5)."""


def _turns(engine: TorchRolloutEngine, prompts: list[list[int]], turns: int, keep: bool = True) -> list[list[GenerationResult]]:
    """``turns`` rounds over ``prompts``: each round continues a different two thirds of the
    rows, each from its last result plus a few observed tokens (a tool's answer)."""
    rng = random.Random(7)
    prefix: list[list[int]] = [[] for _ in prompts]
    rounds = []
    for turn in range(turns):
        rows = [i for i in range(len(prompts)) if i % 3 != turn % 3]
        requests = [GenerationRequest(f"t{i}", prompts[i], list(prefix[i]), keep_kv=keep) for i in rows]
        results = engine.generate(requests, SamplingParams(1.0, 1.0, 24 * (turn + 1) + 12, seed=turn))
        for i, result in zip(rows, results, strict=True):
            prefix[i] = [*result.response_ids, *(rng.randrange(3, 60) for _ in range(rng.randrange(1, 6)))]
        rounds.append(results)
    return rounds


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[1, *(rng.randrange(3, 60) for _ in range(rng.randrange(4, 20)))] for _ in range(9)]


def test_a_turn_from_kept_keys_samples_what_a_full_prefill_samples(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    kept = TorchRolloutEngine(tiny_model_dir, seed=0)
    again = TorchRolloutEngine(tiny_model_dir, seed=0, keep_kv_mib=0)
    ours, theirs = _turns(kept, prompts, 4), _turns(again, prompts, 4)
    for round_ours, round_theirs in zip(ours, theirs, strict=True):
        for a, b in zip(round_ours, round_theirs, strict=True):
            assert a.response_ids == b.response_ids and a.stop_reason == b.stop_reason
            assert max((abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)), default=0.0) < TOLERANCE
    assert kept.kept.reused_tokens > 0 and again.kept.reused_tokens == 0 and len(again.kept) == 0
    # rows that skipped a round still continue from what they kept two rounds before
    assert len(kept.kept) == len(prompts)


def test_only_asked_for_kept_and_only_an_exact_continuation_reuses(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    engine = TorchRolloutEngine(tiny_model_dir, seed=0)
    _turns(engine, prompts, 1, keep=False)
    assert len(engine.kept) == 0
    params = SamplingParams(1.0, 1.0, 10, seed=3)
    first = engine.generate([GenerationRequest("a", prompts[0], keep_kv=True)], params)[0]
    assert len(engine.kept) == 1 and engine.kept.nbytes > 0
    changed = [*prompts[0][:-1], prompts[0][-1] % 50 + 3]  # the history changed: not the kept keys' context
    longer = SamplingParams(1.0, 1.0, 40, seed=4)
    engine.generate([GenerationRequest("a", changed, [*first.response_ids, 5], keep_kv=True)], longer)
    assert engine.kept.reused_tokens == 0
    # the entry left by that turn is used by the next that continues it
    second = engine.generate([GenerationRequest("a", changed, [*first.response_ids, 5], keep_kv=True)], longer)[0]
    reused = engine.kept.reused_tokens
    # the same context again: all of it came from the cache but its last token, fed again for its logits
    assert reused == len(changed) + len(first.response_ids) + 1 - 1
    # another request id does not see it
    engine.generate([GenerationRequest("b", changed, [*second.response_ids, 5], keep_kv=True)], longer)
    assert engine.kept.reused_tokens == reused


@pytest.mark.parametrize("drop", ["update_weights", "reset_prefix_cache", "sleep", "release_kv_cache"])
def test_new_weights_and_a_release_forget_everything_kept(tiny_model_dir: Path, prompts: list[list[int]], drop: str) -> None:
    engine = TorchRolloutEngine(tiny_model_dir, seed=0)
    results = engine.generate([GenerationRequest(f"r{i}", p, keep_kv=True) for i, p in enumerate(prompts)], SamplingParams(1.0, 1.0, 8, seed=1))
    assert len(engine.kept) == len(prompts)
    if drop == "update_weights":
        engine.update_weights(list(engine.export_weights()), version=engine.version + 1)
    else:
        getattr(engine, drop)()
        engine.wake_up()
        engine.resume_kv_cache()
    assert len(engine.kept) == 0 and engine.kept.nbytes == 0
    engine.generate([GenerationRequest(f"r{i}", p, [*r.response_ids, 5]) for i, (p, r) in enumerate(zip(prompts, results, strict=True))], SamplingParams(1.0, 1.0, 20, seed=2))
    assert engine.kept.reused_tokens == 0


def _group(rows: int = 1) -> KeptGroup:
    """A group of ``rows`` rows of 4 positions: 64 bytes a row (keys and values, float32)."""
    return KeptGroup([torch.zeros(rows, 4, 1, 2)], [torch.zeros(rows, 4, 1, 2)])


def test_an_entry_of_another_version_is_never_used() -> None:
    store = KeptKV()
    store.put("a", KeptEntry(3, [1, 2, 3], _group(), 0))
    assert store.take("a", [1, 2, 3, 4], version=4) is None and len(store) == 0 and store.nbytes == 0
    store.put("a", KeptEntry(3, [1, 2, 3], _group(), 0))
    entry = store.take("a", [1, 2, 3], version=3)  # nothing new: the last token is prefilled again
    assert entry is not None and entry.tokens == [1, 2]


def test_the_byte_budget_counts_whole_groups_and_drops_the_oldest_first() -> None:
    store = KeptKV(max_bytes=150)
    for name in "abc":
        store.put(name, KeptEntry(0, [1, 2], _group(), 0))
    assert len(store) == 2 and store.nbytes == 128
    assert store.take("a", [1, 2, 3], 0) is None and store.take("c", [1, 2, 3], 0) is not None
    assert store.nbytes == 64
    shared = KeptKV(max_bytes=1000)
    group = _group(rows=3)
    for row, name in enumerate("xyz"):
        shared.put(name, KeptEntry(0, [1, 2], group, row))
    assert shared.nbytes == 192  # one group, counted once, whole
    assert shared.take("x", [1, 2, 3], 0) is not None and shared.nbytes == 192  # still held by y and z
    shared.clear()
    assert shared.nbytes == 0 and len(shared) == 0 and group.live == 0
    too_big = KeptKV(max_bytes=100)
    too_big.put("a", KeptEntry(0, [1, 2], _group(rows=2), 0))
    assert len(too_big) == 0 and too_big.nbytes == 0
    nothing = KeptKV(max_bytes=0)
    nothing.put("a", KeptEntry(0, [1, 2], _group(), 0))
    assert len(nothing) == 0


def test_spans_index_lists_each_rows_two_ranges() -> None:
    index = spans_index([(2, 4, 6, 8), (0, 0, 1, 4), (3, 5, 5, 5)], torch.device("cpu"))
    assert index.tolist() == [[2, 3, 6, 7], [1, 2, 3, 0], [3, 4, 0, 0]]


def test_the_tool_loop_asks_to_keep_all_but_the_last_turn(tiny_model_dir: Path) -> None:
    from rl_train.engines.agent.loop import AgentLimits, ToolAgentLoop

    class Recording(TorchRolloutEngine):
        asked: list[bool] = []

        def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
            self.asked += [r.keep_kv for r in requests]
            return super().generate(requests, params)

    engine = Recording(tiny_model_dir, seed=0)
    call = engine.tokenizer.encode('<tool_call>{"name":"calculator","arguments":{"expression":"1+2"}}</tool_call>', add_special_tokens=False)
    original = engine.generate

    def always_calls(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        results = original(requests, params)
        return [
            GenerationResult(r.request_id, r.prompt_ids, [*q.response_prefix, *call], [-1.0] * len(call), [0] * len(call), "eos")
            for q, r in zip(requests, results, strict=True)
        ]

    engine.generate = always_calls  # type: ignore[method-assign]
    trajectory = ToolAgentLoop(engine, AgentLimits(max_turns=3, max_response_tokens=400)).run("p/0", [1, 5, 6], SamplingParams(1.0, 1.0, 4, seed=0))
    assert trajectory.stop_reason == "max_turns" and Recording.asked == [True, True, False]
