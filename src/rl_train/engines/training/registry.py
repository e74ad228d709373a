"""The training engines a config can name (``actor.engine``): one explicit table.

Each entry is a builder that imports its engine when called, so that naming an engine in a
config (and validating the name) never imports a heavy backend such as megatron-core. A new
engine is one builder and one line of the table here; the conformance suite then runs
against it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

from pydantic import AfterValidator

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.engines.training.config import ActorConfig
    from rl_train.engines.training.protocol import TrainingEngine


class TrainingEngineBuilder(Protocol):
    def __call__(
        self,
        model_path: str | Path,
        cfg: ActorConfig,
        horizon_steps: int,
        temperature: float,
        seed: int,
        model_impl: str = "auto",
    ) -> TrainingEngine: ...


def _build_torch(
    model_path: str | Path,
    cfg: ActorConfig,
    horizon_steps: int,
    temperature: float,
    seed: int,
    model_impl: str = "auto",
) -> TrainingEngine:
    from rl_train.engines.training.torch_engine import TorchTrainingEngine

    return TorchTrainingEngine(model_path, cfg, horizon_steps, temperature, seed, model_impl)


def _build_megatron(
    model_path: str | Path,
    cfg: ActorConfig,
    horizon_steps: int,
    temperature: float,
    seed: int,
    model_impl: str = "auto",
) -> TrainingEngine:
    """(megatron builds its own GPTModel: ``model_impl`` does not apply)"""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ModuleNotFoundError("actor.engine=megatron needs megatron-core: pip install 'rl-train[megatron]'")
    from rl_train.engines.training.megatron.engine import MegatronTrainingEngine

    return MegatronTrainingEngine(model_path, cfg, horizon_steps, temperature, seed)


TRAINING_ENGINES: Registry[Entry[TrainingEngineBuilder]] = Registry(
    "training engine",
    "actor.engine",
    {
        "torch": Entry(
            _build_torch,
            "the policy as an HF model in plain torch, data parallel over `torch.distributed` "
            "(gloo on CPU), AdamW.",
        ),
        "megatron": Entry(
            _build_megatron,
            "megatron-core's `GPTModel` converted from the HF policy (qwen2, llama), its schedules and "
            "distributed optimizer; `actor.megatron` sets tensor and pipeline parallel sizes (data "
            "parallelism is what is left of `actor.num_ranks`). Needs the `megatron` extra; on CPU it runs "
            "behind a small layer for megatron's hard-coded CUDA calls.",
        ),
    },
)


def build_training_engine(
    name: str,
    model_path: str | Path,
    cfg: ActorConfig,
    horizon_steps: int,
    temperature: float = 1.0,
    seed: int = 0,
    model_impl: str = "auto",
) -> TrainingEngine:
    """The engine registered as ``name``: the policy at ``model_path`` with ``cfg``'s optimizer.

    ``horizon_steps`` is the LR schedule's length in optimizer steps; ``temperature`` the
    one rollout samples at, which the log-probs divide the logits by; ``model_impl`` the
    torch engine's model code (``model.impl``).
    """
    return TRAINING_ENGINES.get(name)(model_path, cfg, horizon_steps, temperature, seed, model_impl)


TrainingEngineName = Annotated[str, AfterValidator(TRAINING_ENGINES.check)]
"""A config field holding a registered training engine name, checked at load."""
