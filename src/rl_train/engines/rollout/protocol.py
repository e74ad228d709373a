"""What every rollout engine offers (R-5.2, R-5.3), and the records it returns.

``RolloutEngine`` lists everything the rollout worker, its wrappers (``generation_loop``,
``turn_taking``), the agent loops and a weight sync call on an engine, plus ``export_weights``,
with which the conformance suite (tests/unit/test_engine_conformance.py) reads back what a sync
loaded; tests/unit/test_engine_contracts.py fails when a worker reaches for a member that is not
declared here. What an engine may lack is declared as a member that says so
(``kv_reused_tokens`` is 0 for an engine that keeps nothing), or as a small runtime-checkable
Protocol (``SparseWeightUpdates``), never found out by probing. An engine joins by being
registered in ``rl_train.engines.rollout.registry``; that suite then checks its behaviour, not
its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from rl_train.engines.weight_sync.base import NamedTensors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from rl_train.engines.weight_sync.boundaries import SparseUpdates

StopReason = Literal["eos", "length", "aborted"]


class EngineStateError(RuntimeError):
    """The engine was asked to generate while asleep or with its KV cache released."""


def check_can_generate(asleep: bool, kv_released: bool) -> None:
    """``EngineStateError`` naming what to call first, when an engine cannot generate now."""
    if asleep:
        raise EngineStateError("rollout engine is asleep; call wake_up() before generate()")
    if kv_released:
        raise EngineStateError("rollout engine's KV cache is released; call resume_kv_cache() first")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    seed: int | None = None
    """Seed of this call's sampling (None: the engine's own stream): equal seeds, equal samples."""
    ignore_eos: bool = False
    """Keep sampling past EOS until max_new_tokens (benchmarks, and a request long enough to abort)."""
    return_routes: bool = False
    """On a mixture-of-experts model, also return each token's experts (``GenerationResult.routes``, R3)."""


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    response_prefix: list[int] = field(default_factory=list)
    """Tokens already generated (a partial rollout to continue under the current weights)."""
    keep_kv: bool = False
    """The caller will come back with this request id and a context that starts with this
    one's and its result's (the next turn of a trajectory): an engine may keep what it computed
    for them until then. A hint only: the results are the same either way."""


@dataclass
class GenerationResult:
    request_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    """The response prefix of the request followed by the tokens generated now."""
    log_probs: list[float]
    """log pi(token) of each token generated now, under the weights that sampled it."""
    token_versions: list[int]
    """Weight version that produced each token generated now (R-1.4)."""
    stop_reason: StopReason
    routes: list[list[list[int]]] | None = None
    """With ``return_routes`` on an MoE model: per token of prompt and response, per MoE layer,
    the experts it went to ([T][L][k]); the last token, never fed back, gets experts 0..k-1."""


@runtime_checkable
class RolloutEngine(Protocol):
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (the worker encodes prompts with it)."""
        ...

    @property
    def version(self) -> int:
        """Weight version served now: the last ``update_weights`` version, 0 before any."""
        ...

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """One result per request, in order. Raises ``EngineStateError`` while asleep or
        while the KV cache is released."""
        ...

    def abort(self) -> int:
        """Stop in-flight generation at the next token, from any thread; the interrupted
        requests return what they have with stop_reason "aborted". Returns how many were in flight."""
        ...

    def sleep(self) -> None:
        """Give back the engine's memory until ``wake_up``: in-flight requests are aborted, the
        KV cache is freed (not offloaded) and the weights leave the accelerator. Weights
        updated while asleep are served after ``wake_up``."""
        ...

    def wake_up(self) -> None: ...

    def release_kv_cache(self) -> None:
        """Quiesce for a weight sync: abort, wait until idle, free the KV cache, keep the weights."""
        ...

    def resume_kv_cache(self) -> None: ...

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes, so that no KV computed under old weights is reused."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Copy HF-named tensors into the engine's weights (asleep or awake) and serve ``version``."""
        ...

    def export_weights(self) -> NamedTensors:
        """The engine's weights, HF-named, as loaded (dtype unchanged)."""
        ...

    def sampling_state(self) -> torch.Tensor:
        """The state of the engine's own sampling stream (a checkpoint, R-9.2): restored with
        ``load_sampling_state``, the engine draws the same samples it would have drawn."""
        ...

    def load_sampling_state(self, state: torch.Tensor) -> None: ...

    @property
    def kv_reused_tokens(self) -> int:
        """Context tokens so far whose keys and values the engine kept from an earlier call
        (``GenerationRequest.keep_kv``) instead of prefilling them again: a running count, read
        as differences (the replica's ``rollout/kv_reused_tokens``). 0 for an engine that keeps none."""
        ...

    def close(self) -> None:
        """Release what the engine holds besides memory (a launched server, a connection, staged
        files) at the end of a run; idempotent. Nothing to do for an in-process engine."""
        ...


@runtime_checkable
class SparseWeightUpdates(Protocol):
    """Optional: lets ``delta`` syncs write only the changed entries, in place
    (see weight_sync.boundaries.accepts_sparse_updates)."""

    def update_weights_sparse(self, updates: SparseUpdates, version: int) -> None: ...
