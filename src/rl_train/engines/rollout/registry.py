"""The rollout engines a config can name (``rollout.engine``): one explicit table.

Each entry is a builder that imports its engine when called, so that naming an engine in a
config (and validating the name) never imports a heavy backend such as sglang. A new engine
is one builder and one line of the table here; the conformance suite then runs against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import AfterValidator

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.engines.rollout.protocol import RolloutEngine


class RolloutEngineBuilder(Protocol):
    def __call__(
        self, model_path: str | Path, *, seed: int, device: str, options: dict[str, Any] | None
    ) -> RolloutEngine: ...


@dataclass(frozen=True)
class RolloutEngineEntry(Entry[RolloutEngineBuilder]):
    """A rollout engine's builder, its line for users, and what it can load besides full weights."""

    loads_lora_adapters: bool = False
    """It serves LoRA adapters synced alone (``weight_sync.adapters``): with ``actor.lora`` a sync
    then sends the adapters, not the merged weights."""


def _build_torch(
    model_path: str | Path, *, seed: int, device: str, options: dict[str, Any] | None
) -> RolloutEngine:
    """``options``: ``{"model_impl": ..., "keep_kv_mib": ...}`` (``model.impl``,
    ``rollout.keep_kv_mib``), or None for the defaults."""
    from rl_train.engines.rollout.kept_kv import DEFAULT_MAX_MIB
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

    options = options or {}
    impl = str(options.get("model_impl", "auto"))
    keep = int(options.get("keep_kv_mib", DEFAULT_MAX_MIB))
    return TorchRolloutEngine(model_path, seed=seed, device=device, model_impl=impl, keep_kv_mib=keep)


def _build_sglang(
    model_path: str | Path, *, seed: int, device: str, options: dict[str, Any] | None
) -> RolloutEngine:
    """An sglang server over HTTP (``options``: a ``rollout.sglang`` dump); the device is the server's."""
    from rl_train.engines.rollout.sglang.engine import SglangRolloutEngine

    return SglangRolloutEngine(model_path, seed=seed, options=options)


ROLLOUT_ENGINES: Registry[RolloutEngineEntry] = Registry(
    "rollout engine",
    "rollout.engine",
    {
        "torch": RolloutEngineEntry(
            _build_torch,
            "the built-in batched sampler with a KV cache, in the replica's process, CPU or one GPU; "
            "LoRA adapters synced alone are merged into its weights.",
            loads_lora_adapters=True,
        ),
        "sglang": RolloutEngineEntry(
            _build_sglang,
            "an sglang server, launched per replica (the `sglang` extra, a GPU) or attached to by "
            "`rollout.sglang.url`, driven over its HTTP API only; weights reach it from disk or over a "
            "`torch.distributed` group, LoRA adapters synced alone through its own LoRA serving.",
            loads_lora_adapters=True,
        ),
    },
)


def build_rollout_engine(
    name: str,
    model_path: str | Path,
    *,
    seed: int = 0,
    device: str = "cpu",
    options: dict[str, Any] | None = None,
) -> RolloutEngine:
    """The engine registered as ``name``, loaded from the HF-format policy at ``model_path``;
    ``options``: the engine's own config section (``rollout.sglang`` for sglang)."""
    return ROLLOUT_ENGINES.get(name)(model_path, seed=seed, device=device, options=options)


RolloutEngineName = Annotated[str, AfterValidator(ROLLOUT_ENGINES.check)]
"""A config field holding a registered rollout engine name, checked at load."""


def loads_lora_adapters(name: str) -> bool:
    """Whether the rollout engine registered as ``name`` serves LoRA adapters synced alone."""
    return ROLLOUT_ENGINES[name].loads_lora_adapters
