"""A reward worker: scores trajectories by their data_source (R-6.1, R-6.2)."""

from __future__ import annotations

from typing import Any

import ray

from rl_train.engines.model.response_decoder import load_response_decoder
from rl_train.engines.reward.rules import route_reward_fn
from rl_train.engines.workers.named_actor import resolve_actor


class RewardWorker:
    def __init__(self, model_path: str, tq: Any) -> None:
        self.decoder = load_response_decoder(model_path)  # transformers only where needed
        self.eos_token_id = self.decoder.eos_token_id
        self.tq = resolve_actor(tq)

    def response_text(self, record: dict[str, Any]) -> str:
        """The model's answer: its graded tokens (response_mask == 1) up to end of sequence. A
        multi-turn trajectory (``agent_turns``) ends each turn with end of sequence, so its
        answer is its last turn: what the model wrote after the last tool observation."""
        ids = record["response_ids"]
        mask = record.get("response_mask") or [1] * len(ids)
        if "agent_turns" in record:
            last = max((i for i, graded in enumerate(mask) if not graded), default=-1) + 1
            ids, mask = ids[last:], mask[last:]
        kept = []
        for token, graded in zip(ids, mask, strict=True):
            if token == self.eos_token_id:
                break
            if graded:
                kept.append(token)
        return self.decoder.decode(kept)

    def score(self, partition: str, keys: list[str]) -> list[float]:
        """Write ``reward`` on each trajectory; returns the scores in key order."""
        records = ray.get(self.tq.get.remote(partition, keys))
        scores = [
            route_reward_fn(r["data_source"])(self.response_text(r), r["ground_truth"]) for r in records
        ]
        ray.get(self.tq.put.remote(partition, {k: {"reward": s} for k, s in zip(keys, scores, strict=True)}))
        return scores
