"""A rollout engine seen through a wrapper that changes how ``generate`` runs, nothing else.

A replica's agent loops call its engine through two wrappers: ``TurnTakingEngine`` merges the
loops' concurrent calls into shared engine batches, and ``GatedEngine`` makes background calls
wait out a pause. Each is a ``RolloutEngine`` in its own right: ``WrappedRolloutEngine`` writes
every member of the Protocol out, handing it to the wrapped engine as it is, and a wrapper
overrides the one it changes. A member added to the Protocol must be added here too (mypy
checks the wrappers against it), so nothing reaches an engine unseen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_train.engines.rollout.protocol import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from rl_train.engines.weight_sync.base import NamedTensors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


class WrappedRolloutEngine:
    """Every ``RolloutEngine`` member, each the wrapped engine's. The wrapped engine's methods
    are looked up at each call, so that a test may replace one on the engine after wrapping."""

    def __init__(self, engine: RolloutEngine) -> None:
        self._engine: RolloutEngine = engine

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._engine.tokenizer

    @property
    def version(self) -> int:
        return self._engine.version

    @property
    def kv_reused_tokens(self) -> int:
        return self._engine.kv_reused_tokens

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return self._engine.generate(requests, params)

    def abort(self) -> int:
        return self._engine.abort()

    def sleep(self) -> None:
        self._engine.sleep()

    def wake_up(self) -> None:
        self._engine.wake_up()

    def release_kv_cache(self) -> None:
        self._engine.release_kv_cache()

    def resume_kv_cache(self) -> None:
        self._engine.resume_kv_cache()

    def reset_prefix_cache(self) -> None:
        self._engine.reset_prefix_cache()

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self._engine.update_weights(named_tensors, version)

    def export_weights(self) -> NamedTensors:
        return self._engine.export_weights()

    def sampling_state(self) -> torch.Tensor:
        return self._engine.sampling_state()

    def load_sampling_state(self, state: torch.Tensor) -> None:
        self._engine.load_sampling_state(state)

    def close(self) -> None:
        self._engine.close()
