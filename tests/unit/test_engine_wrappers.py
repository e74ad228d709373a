"""The replica's engine wrappers are rollout engines: every member of the Protocol reaches the
wrapped engine as it was called, only ``generate`` runs their own way (``GatedEngine`` waits out
a pause, ``TurnTakingEngine`` merges calls), and what they count is the engine's.

A member added to ``RolloutEngine`` that a wrapper does not implement fails
``test_every_member_reaches_the_wrapped_engine`` (as mypy fails the wrapper's module).
"""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rl_train.engines.rollout.protocol import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.workers.generation_loop import GatedEngine, GenerationLoop
from rl_train.engines.workers.turn_taking import TurnTakingEngine

ARGS: dict[str, tuple[Any, ...]] = {
    "generate": ([GenerationRequest("a/0", [1, 5])], SamplingParams(max_new_tokens=2)),
    "update_weights": ([("w", "tensor")], 4),
    "load_sampling_state": ("state",),
}
"""Arguments to call each method with (the others take none)."""


class RecordingEngine:
    """Records each call it gets, with its arguments; answers each member with a value of its own."""

    tokenizer = "the tokenizer"
    version = 7
    kv_reused_tokens = 11

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.calls.append(("generate", (requests, params)))
        return [GenerationResult(r.request_id, r.prompt_ids, [9], [-0.5], [self.version], "eos") for r in requests]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(*args: Any) -> str:
            self.calls.append((name, args))
            return f"{name} answered"

        return method


def protocol_members() -> list[str]:
    return sorted(n for n in vars(RolloutEngine) if not n.startswith("_"))


def wrappers(engine: Any) -> dict[str, Any]:
    """Each wrapper alone, and both stacked as a replica stacks them."""
    return {
        "turn_taking": TurnTakingEngine(engine),
        "gated": GatedEngine(engine, GenerationLoop(lambda *a: [], abort=lambda: None)),
        "gated_turns": GatedEngine(TurnTakingEngine(engine), GenerationLoop(lambda *a: [], abort=lambda: None)),
    }


@pytest.mark.parametrize("wrapper", ["turn_taking", "gated", "gated_turns"])
def test_every_member_reaches_the_wrapped_engine(wrapper: str) -> None:
    engine = RecordingEngine()
    wrapped = wrappers(engine)[wrapper]
    for name in protocol_members():
        if isinstance(inspect.getattr_static(RolloutEngine, name), property):
            assert getattr(wrapped, name) == getattr(engine, name), name
            continue
        args = ARGS.get(name, ())
        engine.calls.clear()
        answer = getattr(wrapped, name)(*args)
        assert engine.calls == [(name, args)], name  # once, with the caller's own arguments
        if name == "generate":
            assert [(r.request_id, r.response_ids) for r in answer] == [("a/0", [9])]
        else:
            assert answer == (f"{name} answered" if name in {"abort", "export_weights", "sampling_state"} else None), name


def test_a_pause_holds_background_generation_but_not_the_calls_that_drive_the_engine() -> None:
    """A weight sync pauses the loop, then drives the engine itself: its calls pass the gate
    while a background generate waits for the resume."""
    engine = RecordingEngine()
    loop = GenerationLoop(lambda *a: [], abort=lambda: None)
    gated = GatedEngine(TurnTakingEngine(engine), loop)
    loop.pause()
    out: list[Any] = []
    waiting = threading.Thread(target=lambda: out.append(gated.generate(*ARGS["generate"])), daemon=True)
    waiting.start()
    gated.release_kv_cache()
    gated.update_weights(*ARGS["update_weights"])
    gated.resume_kv_cache()
    time.sleep(0.05)
    assert [name for name, _ in engine.calls] == ["release_kv_cache", "update_weights", "resume_kv_cache"]
    assert not out  # still at the gate
    loop.resume()
    waiting.join(5)
    assert [name for name, _ in engine.calls][-1] == "generate" and len(out[0]) == 1


def test_a_method_replaced_on_the_engine_after_wrapping_is_the_one_called() -> None:
    """Fault-injection tests replace ``generate`` on a built replica's engine: the wrappers look
    the engine's methods up at each call."""
    engine = RecordingEngine()
    turns = TurnTakingEngine(engine)

    def failing(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        raise RuntimeError("injected")

    engine.generate = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        turns.generate(*ARGS["generate"])


def test_turn_taking_counts_the_context_the_built_in_engine_kept_since_the_last_pop(tiny_model_dir: Path) -> None:
    engine = TorchRolloutEngine(tiny_model_dir, seed=0)
    params = SamplingParams(1.0, 1.0, 6, seed=3)
    prompt = [1, *engine.tokenizer.encode("2+3=", add_special_tokens=False)]
    engine.generate([GenerationRequest("warm", prompt, keep_kv=True)], params)
    engine.generate([GenerationRequest("warm", prompt, [5], keep_kv=True)], SamplingParams(1.0, 1.0, 20))  # before the wrapper
    turns = TurnTakingEngine(engine)
    before = engine.kv_reused_tokens
    first = turns.generate([GenerationRequest("a/0", prompt, keep_kv=True)], params)[0]
    longer = SamplingParams(1.0, 1.0, 20, seed=4)  # room past the first turn's tokens
    turns.generate([GenerationRequest("a/0", prompt, [*first.response_ids, 5], keep_kv=True)], longer)
    reused = engine.kv_reused_tokens - before
    # the second turn's context is the first's (prompt and response) and one new token; all of
    # the first's but its last token (never fed: it came out of the last step) was kept
    assert reused == len(prompt) + len(first.response_ids) - 1 > 0
    assert turns.pop_counts()["kv_reused_tokens"] == reused
    assert turns.pop_counts()["kv_reused_tokens"] == 0
