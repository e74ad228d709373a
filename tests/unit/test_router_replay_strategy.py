"""The router-replay strategies (``actor.router_replay``, R-4.8): what each asks of the engine in
the old_log_prob pass, what it writes beside the log-probs, and how it routes the update.

The engine here is a recording stand-in at the edge (it scores each token by its id and says
which experts each token went to), so that what the strategy hands the engine and what it
writes can be checked exactly; the megatron MoE engine runs the same strategy for real in
tests/unit/megatron/test_router_replay.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.protocol import Batch, LossFn
from rl_train.engines.training.router_replay import (
    REPLAYED_TOKENS_METRIC,
    build_router_replay,
    collate_routes,
)
from rl_train.engines.training.router_replay_modes import ROUTER_REPLAYS
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate

TOP_K, LAYERS = 2, 3


class RoutingEngine:
    """Scores token t as -id/100 and routes it, in layer l, to experts (id + l) % 8 and (id + l + 1) % 8."""

    replays_routes = True
    data_parallel_rank = 0

    def __init__(self) -> None:
        self.passes: list[dict[str, Any]] = []

    def compute_log_probs(
        self, batch: Batch, *, with_entropy: bool = False, pi_old: bool = False, record_routes: bool = False
    ) -> Batch:
        self.passes.append({"pi_old": pi_old, "record_routes": record_routes, "routes": batch.get("routes")})
        ids = batch["input_ids"]
        out = {"log_probs": -ids.float() / 100}
        if record_routes:
            layer = torch.arange(LAYERS).view(1, 1, LAYERS, 1)
            out["routes"] = (ids[..., None, None] + layer + torch.arange(TOP_K).view(1, 1, 1, TOP_K)) % 8
        return out

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        raise AssertionError("not used here")


def records() -> list[dict[str, Any]]:
    return [
        {"prompt_ids": [1, 5], "response_ids": [6, 7, 2]},
        {"prompt_ids": [1, 9, 9], "response_ids": [4]},
    ]


def with_rollout_routes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollout's routes: token i of a row went to experts [i, i + 1] in every layer."""
    return [
        {**r, "routes": [[[i, i + 1]] * LAYERS for i in range(len(r["prompt_ids"]) + len(r["response_ids"]))]}
        for r in rows
    ]


def test_off_asks_for_no_routes_and_writes_none() -> None:
    engine, replay = RoutingEngine(), ROUTER_REPLAYS.get("off")()
    rows = records()
    batch = collate(rows, 0)
    log_probs, extra = replay.old_log_probs(engine, batch, rows)
    assert engine.passes == [{"pi_old": True, "record_routes": False, "routes": None}]
    assert torch.equal(log_probs, -batch["input_ids"].float() / 100)
    assert extra == [{}, {}] and replay.old_log_prob_fields() == []
    replay.check_update_records(rows)  # nothing to replay, nothing missing
    replay.route_update(batch, rows)
    assert "routes" not in batch and replay.update_metrics([batch], 2) == {}


def test_r2_writes_each_trajectory_its_own_recorded_routes_and_the_update_replays_them() -> None:
    engine, replay = RoutingEngine(), ROUTER_REPLAYS.get("r2")()
    rows = records()
    batch = collate(rows, 0)  # width 5: the first row has 5 tokens, the second 4 and one pad
    _, extra = replay.old_log_probs(engine, batch, rows)
    assert engine.passes[0]["pi_old"] and engine.passes[0]["record_routes"]
    # row 1 is [1, 9, 9, 4]: token 9 in layer 0 went to experts 9 % 8 = 1 and 2; only its 4
    # real tokens are written (the padding's routes feed nothing)
    assert [len(e["routes"]) for e in extra] == [5, 4]
    assert extra[1]["routes"][1] == [[1, 2], [2, 3], [3, 4]]
    stored = [{**r, **e} for r, e in zip(rows, extra, strict=True)]
    update = collate(stored, 0)
    replay.route_update(update, stored)
    recorded = engine.compute_log_probs(batch, record_routes=True)["routes"]
    real = batch["attention_mask"].bool()
    assert torch.equal(update["routes"][real], recorded[real])  # the update routes as pi_old did
    assert update["routes"][1, 4].tolist() == [[0, 1]] * LAYERS  # past the row's end: experts 0..k-1


def test_r3_routes_old_log_prob_and_the_update_by_rollout_routes() -> None:
    engine, replay = RoutingEngine(), ROUTER_REPLAYS.get("r3")()
    rows = with_rollout_routes(records())
    assert replay.old_log_prob_fields() == ["routes"]
    batch = collate(rows, 0)
    _, extra = replay.old_log_probs(engine, batch, rows)
    sent = engine.passes[0]
    assert sent["pi_old"] and not sent["record_routes"] and extra == [{}, {}]
    assert sent["routes"][0, :, 0].tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]
    update = collate(rows, 0)
    replay.route_update(update, rows)
    assert torch.equal(update["routes"], sent["routes"])


@pytest.mark.parametrize(("name", "source"), [("r2", "old_log_prob"), ("r3", "rollout")])
def test_an_update_without_the_routes_to_replay_names_the_phase_that_writes_them(name: str, source: str) -> None:
    with pytest.raises(KeyError, match=f"actor.router_replay {name} replays the 'routes' of {source}"):
        ROUTER_REPLAYS.get(name)().check_update_records(records())


def test_replayed_tokens_count_every_token_of_every_epoch() -> None:
    # two mini-batches of 5 + 4 and 3 real tokens, 3 epochs: (9 + 3) x 3 = 36 tokens routed by recorded experts
    rows = with_rollout_routes([*records(), {"prompt_ids": [1, 4], "response_ids": [2]}])
    replay = ROUTER_REPLAYS.get("r3")()
    batches = [collate(rows[:2], 0), collate(rows[2:], 0)]
    assert replay.update_metrics(batches, 3) == {REPLAYED_TOKENS_METRIC: 36.0}


def test_collated_routes_are_right_padded_with_experts_0_to_k() -> None:
    rows = [{"routes": [[[3, 1]], [[2, 0]]]}, {"routes": [[[5, 6]]]}]
    assert collate_routes(rows, 3).tolist() == [
        [[[3, 1]], [[2, 0]], [[0, 1]]],
        [[[5, 6]], [[0, 1]], [[0, 1]]],
    ]


def test_every_configurable_name_loads_its_strategy() -> None:
    strategies = {name: type(ROUTER_REPLAYS.get(name)()).__name__ for name in ROUTER_REPLAYS.names()}
    assert strategies == {"off": "RouteByScores", "r2": "RecordedRoutes", "r3": "RolloutRoutes"}
    with pytest.raises(ValueError, match=r"unknown router-replay mode 'r9'; available: off, r2, r3"):
        ActorConfig(router_replay="r9")


def test_an_engine_that_cannot_replay_is_refused_at_build(tiny_model_dir: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_dir, ActorConfig(), horizon_steps=1)
    assert not engine.replays_routes
    assert not build_router_replay("off", engine, "torch").replays
    for name in ("r2", "r3"):
        with pytest.raises(ValueError, match=f"actor.router_replay '{name}' .* actor.engine 'torch' cannot"):
            build_router_replay(name, engine, "torch")
    with pytest.raises(ValueError, match="unknown router-replay mode 'r4'; available: off, r2, r3"):
        build_router_replay("r4", engine, "torch")
