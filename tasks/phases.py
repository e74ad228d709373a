"""The phase tasks of one local update, in R-3.1 order, and validation."""

from __future__ import annotations

from typing import Any

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from rl_train.tasks.balance import partition_by_tokens
from rl_train.tasks.context import get_run
from rl_train.tasks.correction import AdvantagePhase, bypass_old_log_probs

# Results are keys and small dicts: nothing to cache or persist by default (Prefect stays cheap).
phase_task = task(cache_policy=NO_CACHE, persist_result=False)


def _batch(ctx: Any, batch_id: str) -> dict[str, Any]:
    return ray.get(ctx.pools.tq.get_batch.remote(batch_id))


def _split(keys: list[str], parts: int) -> list[list[str]]:
    return [keys[i::parts] for i in range(parts)]


@phase_task(name="generate")
def generate(run_id: str, step: int, num_groups: int) -> str:
    """(1) Dispatch prompts to the rollout pool and sample complete groups; returns a batch id."""
    ctx = get_run(run_id)
    ctx.replay_buffer.dispatch(num_groups, step)
    return ctx.replay_buffer.sample(num_groups, step)


@phase_task(name="reward")
def reward(run_id: str, batch_id: str) -> dict[str, float]:
    """(2) Score every trajectory of the batch on the reward pool."""
    ctx = get_run(run_id)
    keys = _batch(ctx, batch_id)["keys"]
    shards = _split(keys, len(ctx.pools.rewards))
    scores = [
        s
        for part in ray.get(
            [w.score.remote("train", k) for w, k in zip(ctx.pools.rewards, shards, strict=True)]
        )
        for s in part
    ]
    return {"reward/mean": sum(scores) / max(len(scores), 1), "reward/max": max(scores, default=0.0)}


@phase_task(name="balance")
def balance(run_id: str, batch_id: str) -> dict[str, float]:
    """(3) Split the batch across DP ranks with even token counts."""
    ctx = get_run(run_id)
    keys = _batch(ctx, batch_id)["keys"]
    tags = ray.get(ctx.pools.tq.get_tags.remote("train", keys))
    lengths = [t["prompt_len"] + t["response_len"] for t in tags]
    shards = partition_by_tokens(keys, lengths, len(ctx.pools.trainers))
    ray.get(ctx.pools.tq.update_batch.remote(batch_id, shards=shards))
    response_lengths = [t["response_len"] for t in tags]
    return {
        "response_length/mean": sum(response_lengths) / max(len(response_lengths), 1),
        "balance/max_rank_tokens": float(max(sum(lengths[keys.index(k)] for k in s) for s in shards))
        if keys
        else 0.0,
    }


def _forward_pass(run_id: str, batch_id: str, out_field: str, reference: bool) -> None:
    ctx = get_run(run_id)
    shards = _batch(ctx, batch_id)["shards"]
    ray.get(
        [
            rank.compute_log_probs.remote("train", shard, out_field, reference)
            for rank, shard in zip(ctx.pools.trainers, shards, strict=True)
        ]
    )


@phase_task(name="old_log_prob")
def old_log_prob(run_id: str, batch_id: str) -> None:
    """(4) pi_old log-probs, recomputed by the training engine, or copied in bypass_mode (R-7.1)."""
    ctx = get_run(run_id)
    if not ctx.config.algorithm.rollout_correction.bypass_mode:
        _forward_pass(run_id, batch_id, "old_log_probs", reference=False)
        return
    keys = _batch(ctx, batch_id)["keys"]
    records = ray.get(ctx.pools.tq.get.remote("train", keys))
    values = bypass_old_log_probs(records)
    ray.get(
        ctx.pools.tq.put.remote("train", {k: {"old_log_probs": v} for k, v in zip(keys, values, strict=True)})
    )


@phase_task(name="ref")
def ref(run_id: str, batch_id: str) -> None:
    """(5) Reference log-probs for the KL penalty."""
    _forward_pass(run_id, batch_id, "ref_log_probs", reference=True)


@phase_task(name="advantage")
def advantage(run_id: str, batch_id: str) -> dict[str, float]:
    """(6-7) Rollout correction (IS/RS, ``rollout_corr/*``), token rewards (+ in-reward KL), advantages."""
    ctx = get_run(run_id)
    phase = ctx.extra.get("advantage_phase")
    if phase is None:  # built once per run: the adaptive KL beta and the runbook trends persist
        phase = ctx.extra["advantage_phase"] = AdvantagePhase.from_config(ctx.config.algorithm)
    keys = _batch(ctx, batch_id)["keys"]
    updates, metrics = phase.compute(ray.get(ctx.pools.tq.get.remote("train", keys)))
    ray.get(ctx.pools.tq.put.remote("train", dict(zip(keys, updates, strict=True))))
    return metrics


@phase_task(name="update")
def update(run_id: str, batch_id: str) -> dict[str, float]:
    """(9) Actor update on every DP rank (each rank runs the same number of optimizer steps)."""
    ctx = get_run(run_id)
    batch = _batch(ctx, batch_id)
    mini = ctx.config.actor.ppo_mini_batch_size
    num_mini_batches = len(batch["groups"]) // mini if mini else 1
    per_rank = ray.get(
        [
            rank.update.remote("train", shard, num_mini_batches)
            for rank, shard in zip(ctx.pools.trainers, batch["shards"], strict=True)
        ]
    )
    return per_rank[0]


@phase_task(name="weight_sync")
def weight_sync(run_id: str, version: int) -> dict[str, float]:
    """Push the trained weights to the rollout pool as ``version`` (R-8.5)."""
    ctx = get_run(run_id)
    metrics = ctx.pools.sync_weights(version)
    ctx.version = version
    return metrics


@phase_task(name="weight_sync")
def push_weights(run_id: str, version: int) -> dict[str, float]:
    """separate_async's weight_sync (R-2.6): launch the push of ``version`` without waiting.

    The previous push is awaited first (at most one in flight); its metrics are returned.
    """
    ctx = get_run(run_id)
    metrics = finish_push(run_id)
    ctx.extra["pending_push"] = ctx.pools.start_weight_sync(version)
    ctx.version = version
    return metrics


def finish_push(run_id: str) -> dict[str, float]:
    """Wait for the push in flight, if any, and return its metrics."""
    wait = get_run(run_id).extra.pop("pending_push", None)
    return wait() if wait is not None else {}


@phase_task(name="validate")
def validate(run_id: str, step: int) -> dict[str, float]:
    """Greedy (val_temperature) answers to every validation prompt, scored; nothing is kept."""
    ctx = get_run(run_id)
    tq = ctx.pools.tq
    records = {f"v{step}-{i}": dict(row) for i, row in enumerate(ctx.val_prompts)}
    tags = {k: {"kind": "prompt", "status": "pending"} for k in records}
    ray.get(tq.put.remote("val", records, tags))
    keys = list(records)
    params = {
        "temperature": ctx.config.rollout.val_temperature,
        "top_p": 1.0,
        "max_new_tokens": ctx.config.rollout.max_new_tokens,
    }
    replicas = ctx.pools.rollouts
    traj = [
        k
        for part in ray.get(
            [
                r.generate_prompts.remote("val", s, 1, params)
                for r, s in zip(replicas, _split(keys, len(replicas)), strict=True)
                if s
            ]
        )
        for k in part
    ]
    workers = ctx.pools.rewards
    scores = [
        s
        for part in ray.get(
            [w.score.remote("val", s) for w, s in zip(workers, _split(traj, len(workers)), strict=True) if s]
        )
        for s in part
    ]
    ray.get(tq.delete.remote("val", keys + traj))
    return {"val/reward_mean": sum(scores) / max(len(scores), 1)}


PHASES = ("generate", "reward", "balance", "old_log_prob", "ref", "advantage", "update", "weight_sync")
