"""MoE router replay (``actor.router_replay``, R-4.8): which experts the actor's passes send
each token to.

A trainer rank picks one strategy when it builds its engines (``build_router_replay``), so its
passes never branch on the config string:

- ``off``: every pass routes by the router's own scores.
- ``r2``: the old_log_prob pass records each token's experts and writes them beside
  ``old_log_probs``; the update routes by them, so it is scored by the experts pi_old chose.
- ``r3``: the old_log_prob pass and the update route by the experts rollout used (the records'
  ``routes``, written by the rollout engine), so training scores the tokens as rollout did.

Routes travel in records as nested lists, per token of prompt and response, per MoE layer,
its k experts; in a batch as one tensor [B, T, L, k] (``collate_routes``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rl_train.engines.training.protocol import ROUTES, Batch, TrainingEngine

Record = dict[str, Any]
REPLAYED_TOKENS_METRIC = "actor/router_replay_tokens"
"""Tokens the update routed by recorded experts (summed over ranks and steps)."""


class RouterReplay(Protocol):
    @property
    def replays(self) -> bool:
        """Whether some pass routes by recorded experts (the engine must ``replays_routes``)."""
        ...

    def old_log_prob_fields(self) -> list[str]:
        """Record fields the old_log_prob pass reads besides the trajectory."""
        ...

    def old_log_probs(self, engine: TrainingEngine, batch: Batch, records: list[Record]) -> tuple[torch.Tensor, list[Record]]:
        """The pi_old pass over ``batch`` (collated from ``records``): per-token log-probs [B, T],
        and for each record what to write beside them."""
        ...

    def check_update_records(self, records: list[Record]) -> None:
        """``KeyError`` naming the phase that should have written what the update replays."""
        ...

    def route_update(self, batch: Batch, chunk: list[Record]) -> None:
        """Give an update mini-batch (collated from ``chunk``) the routes its passes follow."""
        ...

    def update_metrics(self, batches: list[Batch], epochs: int) -> dict[str, float]:
        """What the update reports about routing, after ``epochs`` passes over ``batches``."""
        ...


class RouteByScores:
    """``off``: nothing recorded, nothing replayed."""

    replays = False

    def old_log_prob_fields(self) -> list[str]:
        return []

    def old_log_probs(self, engine: TrainingEngine, batch: Batch, records: list[Record]) -> tuple[torch.Tensor, list[Record]]:
        return engine.compute_log_probs(batch, pi_old=True)["log_probs"], [{} for _ in records]

    def check_update_records(self, records: list[Record]) -> None:
        return None

    def route_update(self, batch: Batch, chunk: list[Record]) -> None:
        return None

    def update_metrics(self, batches: list[Batch], epochs: int) -> dict[str, float]:
        return {}


class _ReplayedUpdate:
    """The update side of r2 and r3: each mini-batch carries the records' routes."""

    replays = True
    name = ""
    source = ""
    """The phase whose routes the update replays (named in the error when they are missing)."""

    def check_update_records(self, records: list[Record]) -> None:
        if records and ROUTES not in records[0]:
            raise KeyError(
                f"actor.router_replay {self.name} replays the {ROUTES!r} of {self.source}; the records have none"
            )

    def route_update(self, batch: Batch, chunk: list[Record]) -> None:
        batch[ROUTES] = collate_routes(chunk, batch["input_ids"].shape[1])

    def update_metrics(self, batches: list[Batch], epochs: int) -> dict[str, float]:
        tokens = sum(float(batch["attention_mask"].sum()) for batch in batches)  # whole numbers: exact
        return {REPLAYED_TOKENS_METRIC: tokens * epochs}


class RecordedRoutes(_ReplayedUpdate):
    """``r2``: old_log_prob records the routes of pi_old's pass; the update replays them."""

    name, source = "r2", "old_log_prob"

    def old_log_prob_fields(self) -> list[str]:
        return []

    def old_log_probs(self, engine: TrainingEngine, batch: Batch, records: list[Record]) -> tuple[torch.Tensor, list[Record]]:
        out = engine.compute_log_probs(batch, pi_old=True, record_routes=True)
        fields = [
            {ROUTES: row[: len(r["prompt_ids"]) + len(r["response_ids"])].tolist()}
            for row, r in zip(out[ROUTES], records, strict=True)
        ]
        return out["log_probs"], fields


class RolloutRoutes(_ReplayedUpdate):
    """``r3``: old_log_prob and the update both replay the routes rollout recorded."""

    name, source = "r3", "rollout"

    def old_log_prob_fields(self) -> list[str]:
        return [ROUTES]

    def old_log_probs(self, engine: TrainingEngine, batch: Batch, records: list[Record]) -> tuple[torch.Tensor, list[Record]]:
        if records:
            batch = {**batch, ROUTES: collate_routes(records, batch["input_ids"].shape[1])}
        return engine.compute_log_probs(batch, pi_old=True)["log_probs"], [{} for _ in records]


def build_router_replay(name: str, engine: TrainingEngine, engine_name: str) -> RouterReplay:
    """The strategy ``actor.router_replay`` names; one that replays refuses an engine that
    cannot (``TrainingEngine.replays_routes``)."""
    from rl_train.engines.training.router_replay_modes import ROUTER_REPLAYS

    replay = ROUTER_REPLAYS.get(name)()
    if replay.replays and not engine.replays_routes:
        raise ValueError(
            f"actor.router_replay {name!r} routes tokens by recorded experts, and actor.engine "
            f"{engine_name!r} cannot (it records and replays no routes); use actor.engine megatron "
            "or actor.router_replay off"
        )
    return replay


def collate_routes(records: list[Record], width: int) -> torch.Tensor:
    """The records' ``routes`` as one right-padded tensor [B, width, L, k]; past a row's end (its
    padding, whose outputs feed nothing) each layer gets experts 0..k-1."""
    rows = [torch.tensor(r[ROUTES], dtype=torch.long) for r in records]
    shape = rows[0].shape[1:] if rows else (0, 0)
    out = torch.arange(shape[-1] if shape else 0, dtype=torch.long).expand(len(records), width, *shape).clone()
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out
