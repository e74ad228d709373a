"""The ``actor.router_replay`` table: each name to its strategy in ``router_replay``, by import path.

Kept apart from the strategies so that the config checks the name without importing torch
(the strategies work on tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.engines.training.router_replay import RouterReplay

_HOME = "rl_train.engines.training.router_replay:"

ROUTER_REPLAYS: Registry[Entry[Callable[[], RouterReplay]]] = Registry(
    "router-replay mode",
    "actor.router_replay",
    {
        "off": Entry(_HOME + "RouteByScores", "every pass routes an MoE model's tokens by the router's own scores."),
        "r2": Entry(
            _HOME + "RecordedRoutes",
            "the old_log_prob pass records each token's experts; the update routes by them (megatron engine).",
        ),
        "r3": Entry(
            _HOME + "RolloutRoutes",
            "old_log_prob and the update route by the experts rollout used (built-in rollout engine, megatron engine).",
        ),
    },
)

RouterReplayName = Annotated[str, AfterValidator(ROUTER_REPLAYS.check)]
"""A config field holding a registered router-replay mode, checked at load."""
