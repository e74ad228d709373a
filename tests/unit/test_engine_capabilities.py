"""What the engine Protocols declare an engine may or may not do, checked on every registered
engine (as tests/unit/test_engine_conformance.py checks the rest of the contract): MoE route
replay (``TrainingEngine.replays_routes``), the data-parallel rank, kept keys and values
(``RolloutEngine.kv_reused_tokens``), ``close``, and the value engines' ``ValueEngine`` contract.
An engine says what it lacks through the declared member, and behaves as that member says.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.algorithms.critic_loss import build_critic_loss_fn
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams
from rl_train.engines.rollout.registry import ROLLOUT_ENGINES, build_rollout_engine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.critic_config import CriticConfig
from rl_train.engines.training.critic_protocol import ValueEngine
from rl_train.engines.training.protocol import RoutesNotSupportedError, TrainingEngine
from rl_train.engines.training.registry import TRAINING_ENGINES, build_training_engine
from rl_train.engines.training.value_engine import TorchValueEngine
from rl_train.storage.records import collate

NEEDS = {"megatron": "megatron.core"}
"""Engines whose backend is an optional extra: their cases are skipped, visibly, without it."""
VALUE_ENGINES: dict[str, Callable[[Path, CriticConfig], ValueEngine]] = {
    "torch": lambda model_dir, cfg: TorchValueEngine(model_dir, cfg, seed=0),
}
"""Every value engine (the critic worker builds the torch one)."""


def _training(name: str) -> Any:
    missing = name in NEEDS and importlib.util.find_spec(NEEDS[name].split(".")[0]) is None
    return pytest.param(name, marks=[pytest.mark.skip(reason=f"{NEEDS[name]} is not installed")] if missing else [])


TRAINING = [_training(name) for name in TRAINING_ENGINES.names()]


def records() -> list[dict[str, Any]]:
    """Three trajectories of different lengths, with a spread of advantages and critic targets."""
    rows = [([1, 5, 6], [7, 8, 2]), ([1, 9], [4]), ([1, 9, 9, 7, 8], [9, 10, 11, 2])]
    return [
        {
            "prompt_ids": prompt,
            "response_ids": response,
            "old_log_probs": [-2.0] * len(response),
            "advantages": [(i - 1) / 2.0] * len(response),
            "values": [0.0] * len(response),
            "returns": [float(i % 2)] * len(response),
        }
        for i, (prompt, response) in enumerate(rows)
    ]


# -- training engines ---------------------------------------------------------------------
@pytest.mark.parametrize("training", TRAINING)
def test_a_single_process_engine_is_data_parallel_rank_0(tiny_model_dir: Path, training: str) -> None:
    engine: TrainingEngine = build_training_engine(training, tiny_model_dir, ActorConfig(), 10)
    assert engine.data_parallel_rank == 0


@pytest.mark.parametrize("training", TRAINING)
def test_routes_are_recorded_and_replayed_exactly_or_refused(tiny_model_dir: Path, training: str) -> None:
    """``replays_routes`` true: a pass records each token's experts ([B, T, L, k]; L = 0 for a
    dense model) and a pass routed by them scores the tokens bit for bit as the recording pass
    did. False: asking for routes, or handing them over, is refused in both passes."""
    engine: TrainingEngine = build_training_engine(training, tiny_model_dir, ActorConfig(), 10)
    batch = collate(records(), 0, ["old_log_probs", "advantages"])
    loss_fn = build_actor_loss_fn(ActorConfig())
    if not engine.replays_routes:
        routed = {**batch, "routes": torch.zeros((*batch["input_ids"].shape, 1, 2), dtype=torch.long)}
        with pytest.raises(RoutesNotSupportedError):
            engine.compute_log_probs(batch, record_routes=True)
        with pytest.raises(RoutesNotSupportedError):
            engine.compute_log_probs(routed)
        with pytest.raises(RoutesNotSupportedError):
            engine.train_batch(routed, loss_fn)
        return
    recorded = engine.compute_log_probs(batch, pi_old=True, record_routes=True)
    routes = recorded["routes"]
    assert routes.shape[:2] == batch["input_ids"].shape and routes.dim() == 4
    assert routes.dtype == torch.long
    replayed = engine.compute_log_probs({**batch, "routes": routes})["log_probs"]
    assert torch.equal(replayed, recorded["log_probs"])
    assert torch.isfinite(torch.tensor(engine.train_batch({**batch, "routes": routes}, loss_fn)["actor/loss"]))


# -- rollout engines ----------------------------------------------------------------------
@pytest.fixture
def rollout_engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[RolloutEngine]:
    name = request.param
    options = request.getfixturevalue("sglang_options") if name == "sglang" else None
    engine = build_rollout_engine(name, tiny_model_dir, seed=0, options=options)
    yield engine
    engine.close()


@pytest.mark.parametrize("rollout_engine", ROLLOUT_ENGINES.names(), indirect=True)
def test_kept_context_is_a_running_count_within_what_the_next_turn_continues(rollout_engine: RolloutEngine) -> None:
    """A second turn that continues the first's context (same request id, ``keep_kv``) may reuse
    at most that context; a request with no earlier turn reuses nothing; the count never drops."""
    prompt = [1, *rollout_engine.tokenizer.encode("4+4=", add_special_tokens=False)]
    start = rollout_engine.kv_reused_tokens
    first = rollout_engine.generate([GenerationRequest("t/0", prompt, keep_kv=True)], SamplingParams(1.0, 1.0, 4, seed=1))[0]
    assert rollout_engine.kv_reused_tokens == start
    rollout_engine.generate(
        [GenerationRequest("t/0", prompt, [*first.response_ids, 5], keep_kv=True)], SamplingParams(1.0, 1.0, 12, seed=2)
    )
    reused = rollout_engine.kv_reused_tokens - start
    assert 0 <= reused <= len(prompt) + len(first.response_ids)
    rollout_engine.generate([GenerationRequest("other/0", prompt, [*first.response_ids, 5])], SamplingParams(1.0, 1.0, 12))
    assert rollout_engine.kv_reused_tokens - start == reused


@pytest.mark.parametrize("rollout_engine", ROLLOUT_ENGINES.names(), indirect=True)
def test_close_is_idempotent(rollout_engine: RolloutEngine) -> None:
    rollout_engine.close()
    rollout_engine.close()  # and once more by the fixture


# -- value engines ------------------------------------------------------------------------
@pytest.mark.parametrize("value", list(VALUE_ENGINES))
def test_a_restored_value_engine_makes_the_update_the_saved_one_made(tiny_model_dir: Path, value: str) -> None:
    """state_dict -> load_state_dict into a fresh engine: the next update's metrics and the values
    after it are the saved engine's, bit for bit (a resumed critic, R-9.2)."""
    cfg = CriticConfig(lr_warmup_steps=2, lr=1e-2)
    rows = records()
    batch = collate(rows, 0, ["values", "returns"])
    loss_fn = build_critic_loss_fn(cfg)
    saved = VALUE_ENGINES[value](tiny_model_dir, cfg)
    saved.train_batch(batch, loss_fn)
    restored = VALUE_ENGINES[value](tiny_model_dir, cfg)
    # a checkpoint's copy: an optimizer loads a state's tensors as they are, and sharing them
    # would let either engine's step move the other's moments
    restored.load_state_dict(copy.deepcopy(saved.state_dict()))
    assert restored.train_batch(batch, loss_fn) == saved.train_batch(batch, loss_fn)
    values = restored.compute_values(batch)
    assert values.shape == batch["input_ids"].shape and torch.equal(values, saved.compute_values(batch))
    assert not torch.equal(values, torch.zeros_like(values))  # the updates moved the zero-initialised head
