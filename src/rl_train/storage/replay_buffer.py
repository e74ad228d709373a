"""The sync replay buffer (R-2.9): dispatch prompts, then sample complete groups.

Prompts enter the TransferQueue as ``pending`` records, one group per prompt; rollout
replicas mark them ``running`` and ``finished`` and write ``n`` trajectories each. A group is
sampleable once its prompt is finished and all its trajectories are present; samples are
taken oldest first. The async buffers of the async modes share this interface.

DAPO group filter (R-7.3, opt-in with ``replay.filter_groups``; it judges the reward, or the
sub-score ``replay.filter_groups_metric`` names): after each generation round the groups
without gradient are evicted, and each evicted group is refilled with two
fresh prompts (a second round would otherwise often come up short again). Once enough groups
with gradient are ready, dispatch stops (draining) and ``sample`` discards the surplus. After
``replay.max_filter_rounds`` rounds, groups without gradient fill what is still missing (they
contribute zero advantage) and are counted as ``replay/filter_shortfall``, so a policy that
solves everything slows down instead of stalling.

Streaming scores (``reward.streaming``): the groups of a batch are scored before it is sampled;
most were scored in the background as rollout finished them, and each reward worker scores
what it has not yet (``scored_records``), so the reward phase only reads them back.

Infra failures (R-6.5, opt-in with ``replay.refill_infra_groups`` when the filter is off, which
evicts them anyway): a group left with fewer than two real scores is replaced by a fresh prompt.

Rollout failures: a replica whose ``generate_prompts`` raises (or dies) does not end the run.
Every group of the round that did not finish is retried as it is, or evicted and replaced by
one fresh prompt with ``replay.refill_failed_groups``; the round's errors are counted in
``rollout/generation_errors`` and logged. Only ``replay.max_failure_rounds`` rounds in a row
with a failure stop the run (``RolloutFailedError``): a broken engine must not loop forever.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from rl_train.storage.group_scoring import (
    groups_with_gradient,
    real_score_counts,
    scored_records,
    trajectory_keys,
)
from rl_train.storage.handles import GeneratingReplica, Pending
from rl_train.storage.replay_base import ReplayBufferBase

PARTITION = "train"
MIN_REAL_SCORES = 2
"""A group needs two real scores for a group baseline to say anything (``refill_infra_groups``)."""
logger = logging.getLogger(__name__)


class RolloutFailedError(RuntimeError):
    """Generation failed ``replay.max_failure_rounds`` rounds in a row: rollout cannot go on."""


def describe_error(exc: BaseException) -> str:
    """One line: a Ray task error carries the remote traceback, whose last line names the cause."""
    lines = str(exc).strip().splitlines()
    return lines[-1].strip() if len(lines) > 1 else f"{type(exc).__name__}: {exc}"


Round = list[Pending[list[str]]]
"""The replicas' calls of one generation round, in flight."""


class ReplayBuffer(ReplayBufferBase[GeneratingReplica]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counts: Counter[str] = Counter()
        self._carry: list[str] = []
        """Resumed prompt groups, pending in the queue: the next draws take them first."""
        self._prefetched: tuple[int, int, list[str], Round, list[str]] | None = None
        """(step, groups, keys, replica calls, errors) of a first round started by ``prefetch``."""

    def prefetch(self, num_groups: int, step: int) -> None:
        """Start the first generation round of step ``step`` now and return at once; its
        ``dispatch`` collects it. The trainer calls this right after a weight sync, so the
        round samples with the weights it will be trained against (still on-policy) while the
        driver finishes the step before (metrics, the step's flow run, the next one's start)."""
        keys = self._put_prompts(num_groups, step)
        pending, errors = self._submit_round(keys)
        self._prefetched = (step, num_groups, keys, pending, errors)

    def dispatch(self, num_groups: int, step: int) -> list[str]:
        """Generate ``num_groups`` new prompt groups (blocking); with the DAPO filter, keep
        generating until that many carry gradient. Returns every group left in the queue."""
        keys = self._generate(num_groups, step)
        if not self.cfg.filter_groups:
            return self._refill_infra_groups(keys, step) if self.cfg.refill_infra_groups else keys
        ready: list[str] = []
        for round_number in range(1, self.cfg.max_filter_rounds + 1):
            verdict = groups_with_gradient(self.tq, self.rewards, PARTITION, keys, self.n, self.cfg.filter_groups_metric)
            ready += [k for k in keys if verdict[k]]
            no_gradient = [k for k in keys if not verdict[k]]
            if len(ready) < num_groups and round_number == self.cfg.max_filter_rounds:
                filler = no_gradient[: num_groups - len(ready)]
                ready += filler
                no_gradient = no_gradient[len(filler) :]
                self._counts["filter_shortfall"] += len(filler)
            self._delete(no_gradient)
            self._counts["evicted_filter"] += len(no_gradient)
            if len(ready) >= num_groups:
                break  # draining: no more dispatch; sample discards the surplus
            keys = self._generate(2 * len(no_gradient), step)
            self._counts["refill"] += len(keys)
        return ready

    def _refill_infra_groups(self, keys: list[str], step: int) -> list[str]:
        """``replay.refill_infra_groups``: replace each group with fewer than two real scores by
        a fresh prompt, as a failed group is (R-6.5); after ``max_filter_rounds`` rounds, the
        groups still short are kept (their infra samples train nothing) and counted."""
        kept: list[str] = []
        for round_number in range(1, self.cfg.max_filter_rounds + 1):
            counts = real_score_counts(self.tq, self.rewards, PARTITION, keys, self.n)
            short = [k for k in keys if counts[k] < MIN_REAL_SCORES]
            kept += [k for k in keys if counts[k] >= MIN_REAL_SCORES]
            if not short or round_number == self.cfg.max_filter_rounds:
                self._counts["infra_shortfall"] += len(short)
                return kept + short
            self._delete(short)
            self._counts["evicted_infra"] += len(short)
            keys = self._generate(len(short), step)
            self._counts["refill"] += len(keys)
        return kept

    def _generate(self, num_groups: int, step: int) -> list[str]:
        """Draw ``num_groups`` prompts and generate them; failed groups are retried or refilled
        until a round has no failure. Returns the finished groups (refills replace evictions)."""
        started, self._prefetched = self._prefetched, None
        if started is not None and started[:2] == (step, num_groups):
            keys, pending, errors = started[2], started[3], started[4]
        else:
            if started is not None:  # not what was prefetched: its groups finish and wait to be sampled
                self._collect_round(started[2], started[3], started[4])
            keys = self._put_prompts(num_groups, step)
            pending, errors = self._submit_round(keys)
        done: list[str] = []
        failed_rounds = 0
        while True:
            failed, errors = self._collect_round(keys, pending, errors)
            failed_set = set(failed)
            done += [k for k in keys if k not in failed_set]
            if not failed:
                return done
            failed_rounds += 1
            self._report_failures(failed_rounds, len(failed), len(keys), errors)
            if self.revive is not None:
                self._counts["revived_replicas"] += len(self.revive())
            keys = self._recover(failed, step)
            pending, errors = self._submit_round(keys)

    def _report_failures(
        self, failed_rounds: int, num_failed: int, num_groups: int, errors: list[str]
    ) -> None:
        """Count and log a round's failures; raise ``RolloutFailedError`` at the limit of rounds in a row."""
        self._counts["generation_errors"] += len(errors)
        first = errors[0] if errors else "no replica raised: the groups were left unfinished (a failed gateway agent logs why on its replica)"
        limit = self.cfg.max_failure_rounds
        if failed_rounds >= limit:
            raise RolloutFailedError(
                f"rollout failed {failed_rounds} generation rounds in a row (replay.max_failure_rounds "
                f"= {limit}); last round: {num_failed} of {num_groups} groups failed. First error: "
                f"{first}. Likely causes: a rollout replica that cannot generate (out of memory, "
                "crashed or killed, a bad model.path), or prompts the engine rejects (too long), "
                "which replay.refill_failed_groups=true would replace instead of retrying"
            )
        logger.warning(
            "rollout: %d of %d groups failed (round %d of at most %d in a row); %s them. First error: %s",
            num_failed,
            num_groups,
            failed_rounds,
            limit,
            "refilling" if self.cfg.refill_failed_groups else "retrying",
            first,
        )

    def _put_prompts(self, num_groups: int, step: int) -> list[str]:
        carried, self._carry = self._carry[:num_groups], self._carry[num_groups:]
        taken = self.loader.take(num_groups - len(carried))
        records = {f"p{index}": dict(row, prompt_step=step) for index, row in taken}
        tags = {key: {"kind": "prompt", "status": "pending", "step": step} for key in records}
        if records:
            self.tq.put(PARTITION, records, tags)
        return carried + list(records)

    def _submit_round(self, keys: list[str]) -> tuple[Round, list[str]]:
        """Every replica starts generating its shard; (their calls, errors raised at once)."""
        shards = [keys[i :: len(self.rollouts)] for i in range(len(self.rollouts))]
        pending: Round = []
        errors: list[str] = []
        for replica, shard in zip(self.rollouts, shards, strict=True):
            if shard:
                try:  # an in-process replica runs, and raises, right here
                    pending.append(replica.start_generating(PARTITION, shard, self.n, self.sampling))
                except Exception as exc:
                    errors.append(describe_error(exc))
        return pending, errors

    def _collect_round(self, keys: list[str], pending: Round, errors: list[str]) -> tuple[list[str], list[str]]:
        """Each replica's call is awaited on its own, so one failing replica does not hide the
        others' results. Returns (groups not finished, errors)."""
        errors = list(errors)
        for call in pending:
            try:
                call.wait()
            except Exception as exc:  # a Ray task error, or a replica that died
                errors.append(describe_error(exc))
        tags = self.tq.get_tags(PARTITION, keys)
        return [k for k, t in zip(keys, tags, strict=True) if t.get("status") != "finished"], errors

    def _recover(self, failed: list[str], step: int) -> list[str]:
        """The groups to generate next: fresh prompts for the evicted ones with
        ``replay.refill_failed_groups``, else the same prompts, their partial output dropped."""
        if self.cfg.refill_failed_groups:
            self._delete(failed)
            self._counts["evicted_failure"] += len(failed)
            self._counts["refill"] += len(failed)
            return self._put_prompts(len(failed), step)
        self.tq.delete(PARTITION, trajectory_keys(failed, self.n))
        self.tq.set_tags(PARTITION, {k: {"status": "pending", "partial": False} for k in failed})
        self._counts["retried_failure"] += len(failed)
        return failed

    def sample(self, num_groups: int, step: int) -> str:
        """A batch of ``num_groups`` complete groups (oldest first); returns its batch id.

        With the DAPO filter on, finished groups beyond ``num_groups`` (its over-provisioning)
        are discarded; without it they stay for the next sample.
        """
        finished = self.tq.query(PARTITION, kind="prompt", status="finished")
        if len(finished) < num_groups:
            raise RuntimeError(f"replay buffer: {len(finished)} finished groups, {num_groups} requested")
        groups, surplus = finished[:num_groups], finished[num_groups:]
        if surplus and self.cfg.filter_groups:  # the filter's over-provisioning
            self._delete(surplus)
            self._counts["discarded_surplus"] += len(surplus)
        if self.streaming:  # only groups whose scores are all in are sampled
            scored_records(self.tq, self.rewards, PARTITION, groups, self.n)
        batch_id = f"step{step}-{uuid.uuid4().hex[:8]}"
        self.tq.put_batch(batch_id, PARTITION, trajectory_keys(groups, self.n), groups=groups, step=step)
        return batch_id

    def _delete(self, groups: list[str]) -> None:
        if groups:
            self.tq.delete(PARTITION, groups + trajectory_keys(groups, self.n))

    def release(self, batch_id: str) -> None:
        """Forget a trained batch: its trajectories and their prompts leave the queue."""
        batch = self.tq.get_batch(batch_id, ["groups"])
        self.tq.delete(PARTITION, batch["groups"])
        self.tq.drop_batch(batch_id)

    def pop_metrics(self) -> dict[str, float]:
        """The DAPO filter's and the rollout failures' figures since the last call."""
        names = ("evicted_filter", "refill", "discarded_surplus", "filter_shortfall")
        metrics = {f"replay/{name}": float(self._counts[name]) for name in names}
        metrics["replay/evicted_failure"] = float(self._counts["evicted_failure"])
        metrics["replay/retried_failure"] = float(self._counts["retried_failure"])
        metrics["rollout/generation_errors"] = float(self._counts["generation_errors"])
        metrics["rollout/revived_replicas"] = float(self._counts["revived_replicas"])
        if self.cfg.refill_infra_groups:
            metrics["replay/evicted_infra"] = float(self._counts["evicted_infra"])
            metrics["replay/infra_shortfall"] = float(self._counts["infra_shortfall"])
        self._counts.clear()
        return metrics

    def requeue(self, keys: list[str], step: int) -> None:
        self._carry = list(keys)
