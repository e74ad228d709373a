"""What every rollout engine offers (R-5.2, R-5.3), and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from rl_train.engines.weight_sync.base import NamedTensors

StopReason = Literal["eos", "length", "aborted"]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    response_prefix: list[int] = field(default_factory=list)
    """Tokens already generated (a partial rollout to continue under the current weights)."""


@dataclass
class GenerationResult:
    request_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    """log pi(token) of each response token under the weights that sampled it."""
    token_versions: list[int]
    """Weight version that produced each response token (R-1.4)."""
    stop_reason: StopReason


@runtime_checkable
class RolloutEngine(Protocol):
    version: int

    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]: ...

    def abort(self) -> int: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def release_kv_cache(self) -> None: ...

    def resume_kv_cache(self) -> None: ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None: ...

    # Optional: update_weights_sparse(updates, version), which lets `delta` syncs write only
    # the changed entries (see weight_sync.boundaries.accepts_sparse_updates).

    def reset_prefix_cache(self) -> None: ...
