"""Engines are chosen by name in config (``actor.engine``, ``rollout.engine``) from explicit tables."""

from __future__ import annotations

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.rollout.protocol import RolloutEngine
from rl_train.engines.rollout.registry import ROLLOUT_ENGINES, build_rollout_engine
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.protocol import TrainingEngine
from rl_train.engines.training.registry import TRAINING_ENGINES, build_training_engine
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.registry import UnknownNameError


def test_torch_is_the_default_of_both_sections() -> None:
    config = load_config()
    assert (config.actor.engine, config.rollout.engine) == ("torch", "torch")
    assert "torch" in TRAINING_ENGINES and "torch" in ROLLOUT_ENGINES


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.engine=vllm", "rollout.engine: unknown rollout engine 'vllm'; available: sglang, torch"),
        ("actor.engine=deepspeed", "actor.engine: unknown training engine 'deepspeed'; available: megatron, torch"),
        (
            "actor.megatron.tensor_parallel_size=2",
            "actor.megatron sets tensor x pipeline parallel 2 but actor.engine is 'torch'",
        ),
        (
            ["actor.engine=megatron", "actor.num_ranks=3", "actor.megatron.pipeline_parallel_size=2"],
            "actor.num_ranks=3 is not divisible by actor.megatron.tensor_parallel_size x pipeline_parallel_size = 2",
        ),
        ("actor.router_replay=r2", "actor.router_replay 'r2' replays megatron-core's MoE routers"),
        (
            ["actor.engine=megatron", "actor.router_replay=r3", "rollout.engine=sglang"],
            "actor.router_replay r3 replays the experts rollout used, and rollout.engine 'sglang' does not",
        ),
    ],
)
def test_an_unregistered_engine_fails_at_load_with_its_dotted_path(override: str | list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override] if isinstance(override, str) else override)
    assert message in str(err.value)


def test_builders_return_the_registered_engine(tiny_model_dir) -> None:
    rollout = build_rollout_engine("torch", tiny_model_dir, seed=1)
    training = build_training_engine("torch", tiny_model_dir, ActorConfig(), 10, 0.7, seed=1)
    assert isinstance(rollout, TorchRolloutEngine) and isinstance(rollout, RolloutEngine)
    assert isinstance(training, TorchTrainingEngine) and isinstance(training, TrainingEngine)
    assert training.temperature == 0.7
    with pytest.raises(UnknownNameError, match="unknown rollout engine 'nope'; available: sglang, torch"):
        build_rollout_engine("nope", tiny_model_dir)
    with pytest.raises(UnknownNameError, match="unknown training engine 'nope'; available: megatron, torch"):
        build_training_engine("nope", tiny_model_dir, ActorConfig(), 10)


def test_naming_an_engine_imports_no_engine_module() -> None:
    """The tables hold lazy builders: validating a config loads no backend (torch, sglang...)."""
    import subprocess
    import sys

    code = (
        "import sys; from rl_train.engines.training.config import ActorConfig; "
        "from rl_train.engines.rollout.registry import ROLLOUT_ENGINES; ActorConfig(engine='torch'); "
        "ActorConfig(engine='megatron'); "
        "print(sorted(m for m in sys.modules if m.endswith(('torch_engine', 'sglang', 'megatron'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
