"""The phase tasks of one local update, in R-3.1 order, and validation.

Every task but ``generate`` takes the run id and a batch id (or version) and nothing else,
so a retry in a fresh process rejoins the run's actors (``join_run``). The records never
pass through here: each phase runs on the pool that holds its model or on the queue actor
that holds the data. ``generate`` is the exception by design: it drives the replay buffer,
which is the driver's state (the trainer passes it in).
"""

from __future__ import annotations

from typing import Any, Protocol

from rl_train.engines.reward.metrics import reward_metrics
from rl_train.engines.workers.weight_sync_link import PendingPush
from rl_train.tasks.context import join_run
from rl_train.tasks.retry import phase_task, retrying_phase_task


class SamplingBuffer(Protocol):
    """What ``generate`` needs of a replay buffer (R-2.9)."""

    def dispatch(self, num_groups: int, step: int) -> list[str]: ...

    def sample(self, num_groups: int, step: int) -> str: ...


@phase_task(name="generate")
def generate(buffer: SamplingBuffer, step: int, num_groups: int) -> str:
    """(1) Dispatch prompts to the rollout pool and sample complete groups; returns a batch id."""
    buffer.dispatch(num_groups, step)
    return buffer.sample(num_groups, step)


@phase_task(name="greedy_baseline")
def greedy_baseline(run_id: str, batch_id: str) -> dict[str, float]:
    """(1, estimators with a greedy baseline: remax) One greedy answer per prompt of the batch,
    scored; its reward is written on each of the prompt's trajectories as ``baseline_reward``.
    The greedy answers are deleted, never trained on. Runs right after sampling, while the
    rollout replicas that sampled the batch are awake."""
    run = join_run(run_id)
    return run.pools.greedy_baselines(batch_id, run.config.rollout.max_new_tokens)


@retrying_phase_task(name="reward")
def reward(run_id: str, batch_id: str) -> dict[str, float]:
    """(2) Score every trajectory of the batch on the reward pool: with ``reward.streaming`` most
    were scored as their groups finished and are read back; the rest (late, or lost with a
    reward worker that died) are scored now."""
    pools = join_run(run_id).pools
    return reward_metrics(pools.reward.score("train", pools.queue.batch(batch_id, ["keys"])["keys"]))


@retrying_phase_task(name="teacher")
def teacher(run_id: str, batch_id: str) -> dict[str, float]:
    """(2, distillation) The teacher's scores of every response token of the batch, on the teacher
    pool: a trajectory scored already for its current tokens is left as it is, so a retry after
    a teacher worker died scores only what it had not written (R-4.10). With
    ``teacher.streaming`` most were scored as their groups finished (``teacher/found_scored``);
    ``teacher/scored`` counts what this phase scored itself."""
    pools = join_run(run_id).pools
    return pools.teacher.score("train", pools.queue.batch(batch_id, ["keys"])["keys"])


@retrying_phase_task(name="balance")
def balance(run_id: str, batch_id: str) -> dict[str, float]:
    """(3) Split the batch across DP ranks with even token counts (in the queue actor)."""
    pools = join_run(run_id).pools
    return pools.queue.balance(batch_id, pools.trainer.num_shards)


@retrying_phase_task(name="old_log_prob")
def old_log_prob(run_id: str, batch_id: str) -> dict[str, float]:
    """(4) pi_old log-probs, recomputed by the training engine, or copied in bypass_mode (R-7.1);
    with ``bypass_current_version``, copied for the trajectories pi_old's weights sampled and
    recomputed for the rest."""
    run = join_run(run_id)
    pools, correction = run.pools, run.config.algorithm.rollout_correction
    if correction.bypass_mode:
        pools.queue.copy_rollout_log_probs(batch_id)
        return {}
    metrics: dict[str, float] = {}
    if correction.bypass_current_version:  # the shards left to recompute
        shards, metrics = pools.queue.copy_current_log_probs(batch_id)
    else:
        shards = pools.queue.batch(batch_id, ["shards"])["shards"]
    pools.trainer.compute_log_probs(shards, "old_log_probs", reference=False)
    return metrics


@retrying_phase_task(name="ref")
def ref(run_id: str, batch_id: str) -> None:
    """(5) Reference log-probs for the KL penalty."""
    pools = join_run(run_id).pools
    shards = pools.queue.batch(batch_id, ["shards"])["shards"]
    pools.trainer.compute_log_probs(shards, "ref_log_probs", reference=True)


@retrying_phase_task(name="values")
def values(run_id: str, batch_id: str) -> None:
    """(6) Critic values V_old of every response token, on the critic pool (when the run has a critic)."""
    pools = join_run(run_id).pools
    pools.critic.compute_values(pools.queue.batch(batch_id, ["keys"])["keys"])


@phase_task(name="advantage")
def advantage(run_id: str, batch_id: str) -> dict[str, float]:
    """(6-7) Rollout correction (IS/RS, ``rollout_corr/*``), token rewards (+ in-reward KL),
    advantages: computed in the queue actor, where the records are."""
    return join_run(run_id).pools.queue.compute_advantages(batch_id)


@phase_task(name="critic_update")
def critic_update(run_id: str, batch_id: str) -> dict[str, float]:
    """(8) Critic update towards the advantage phase's returns (clipped value loss), on every
    critic rank; the metrics (``critic/*``) are the mean over ranks."""
    run = join_run(run_id)
    mini = run.config.critic.ppo_mini_batch_size
    batch = run.pools.queue.batch(batch_id, ["groups", "keys"])
    return run.pools.critic.update(batch["keys"], len(batch["groups"]) // mini if mini else 1)


@phase_task(name="update")
def update(run_id: str, batch_id: str) -> dict[str, float]:
    """(9) Actor update on every DP rank (each rank runs the same number of optimizer steps);
    the metrics are the mean over ranks."""
    run = join_run(run_id)
    mini = run.config.actor.ppo_mini_batch_size
    batch = run.pools.queue.batch(batch_id, ["groups", "shards"])
    return run.pools.trainer.update(batch["shards"], len(batch["groups"]) // mini if mini else 1)


@phase_task(name="weight_sync")
def weight_sync(run_id: str, version: int) -> dict[str, float]:
    """Push the trained weights to the rollout pool as ``version`` and wait (R-8.5)."""
    return join_run(run_id).pools.weight_sync.sync(version)


@phase_task(name="weight_sync")
def push_weights(
    run_id: str, version: int, previous: PendingPush | None
) -> tuple[PendingPush, dict[str, float]]:
    """separate_async's weight_sync (R-2.6): launch the push of ``version`` without waiting.

    The previous push is awaited first (at most one in flight); its metrics are returned with
    the new push, which runs beside the next step's training."""
    metrics = previous.wait() if previous is not None else {}
    return join_run(run_id).pools.weight_sync.start_push(version), metrics


@phase_task(name="validate")
def validate(run_id: str, step: int) -> dict[str, float]:
    """Greedy (val_temperature) answers to every validation prompt, scored; nothing is kept."""
    run = join_run(run_id)
    pools, queue = run.pools, run.pools.queue.records
    records = {f"v{step}-{i}": dict(row) for i, row in enumerate(run.val_prompts)}
    tags = {k: {"kind": "prompt", "status": "pending"} for k in records}
    queue.put("val", records, tags)
    params: dict[str, Any] = {
        "temperature": run.config.rollout.val_temperature,
        "top_p": 1.0,
        "max_new_tokens": run.config.rollout.max_new_tokens,
    }
    keys = list(records)
    trajectories = pools.rollout.generate("val", keys, 1, params)
    samples = pools.reward.score("val", trajectories)
    queue.delete("val", keys + trajectories)
    return {"val/reward_mean": reward_metrics(samples)["reward/mean"]}


PHASES = ("generate", "reward", "balance", "old_log_prob", "ref", "advantage", "update", "weight_sync")
CRITIC_PHASES = ("values", "critic_update")
"""Run only when the run has a critic (``critic.enable``, on for estimators that read values)."""
TEACHER_PHASES = ("teacher",)
"""Run only when the policy loss reads a teacher's scores (``teacher.path``)."""
GREEDY_BASELINE_PHASES = ("greedy_baseline",)
"""Run only for estimators with a greedy baseline (remax)."""
