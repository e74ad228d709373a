"""The async modes' replay buffer (R-2.9, R-7.2, R-7.3, R-9.4).

Dispatch never waits: prompts go into the TransferQueue as ``pending`` records, one group
at a time, and are queued on a rollout replica that generates in the background. The buffer
keeps a fixed number of groups outstanding (``prefetch_batches`` batches beyond the one
being sampled); every group that leaves (sampled, evicted) is replaced by exactly one new
draw, so the refill accounting is exact: an evicted group costs one refill, not two.

Staleness comes from the tokens' actual weight versions, never from the dispatch step: a
partial rollout continued under new weights is as old as its oldest token. Weight version
``v`` is the one pushed at the end of global step ``v``, so the trainer of step ``k`` holds
``k - 1``. Two counts of the same thing:

- *versions behind* = ``(k - 1) - min token version``: 0 when on-policy, at most 1 in
  colocate_async. The ``replay/staleness_*`` metrics report this count.
- the spec's staleness (R-7.2) = ``current step - generating step + 1`` = versions behind
  + 1: 1 when on-policy. ``max_off_policy_threshold`` is compared with this one, exactly as
  R-7.2 states, so a threshold t keeps finished groups at most t - 1 versions behind.

Prompts that have no tokens yet are as old as the version served when they were dispatched.

- ``drop``: finished groups whose staleness exceeds ``max_off_policy_threshold`` are evicted
  and refilled.
- ``wait``: sampling blocks while any pending/running prompt has staleness at or above the
  threshold, so a late prompt is trained at the limit rather than dropped past it. A group
  that is already finished and past the threshold (it aged in a prefetch queue deeper than
  the bound) is evicted as under ``drop``: no wait makes it fresher.
- DAPO filter (opt-in): groups without gradient (R-7.3) are evicted and refilled.
- Failed groups (a replica's background generation raised) are retried as they are, or
  evicted and refilled with ``refill_failed_groups``; the run goes on. A rollout that keeps
  failing is bounded by ``sample_timeout_seconds``, whose error then says so.
- Streaming scores (``reward.streaming``, on by default here): a finished group is sampled only
  once its prompt is tagged ``scored`` (the reward workers score groups as rollout finishes
  them); until then it waits, while rollout goes on: a group waiting for its scores does not
  count among the outstanding ones (up to ``awaiting_scores_multiple`` times the target: a
  grader whose latency spans several steps needs that many groups in flight to keep up, by
  Little's law), so a late grader does not leave rollout idle. A group that waited keeps its
  slot free once scored, until it is sampled: a grader answers a batch of groups at once, and
  were that burst to take the rollout's slots, rollout would idle while the trainer works
  through it (the bench, ``bench/late_grader.py``, saw rollout idle whole steps so). One that
  never answers still
  grows the queue by a bounded amount, and a group that ages past the staleness limit while it
  waits is evicted as any other. Groups still unscored are handed to their
  reward workers again at the first scan (a resumed run's) and at each liveness check (a worker
  that died lost its queue); a worker ignores those it holds already.
- Groups are sampled oldest first (oldest token version, then dispatch order).
- Only the ``train`` partition is read or evicted; validation records are never touched.
"""

from __future__ import annotations

import importlib
import time
import uuid
from collections import Counter
from typing import Any, cast

from rl_train.storage.group_scoring import groups_by_owner, groups_with_gradient, trajectory_keys
from rl_train.storage.handles import QueueingReplica, StreamingScorer
from rl_train.storage.replay_base import ReplayBufferBase

PARTITION = "train"
LIVENESS_CHECK_SECONDS = 5.0
"""While sampling waits this long without enough groups, it checks that no replica died."""


def spec_staleness(trainer_version: int, oldest_token_version: int) -> int:
    """R-7.2's staleness: versions behind + 1 (1 for on-policy tokens)."""
    return trainer_version - oldest_token_version + 1


class SampleTimeoutError(TimeoutError):
    """Not enough finished groups arrived within ``replay.sample_timeout_seconds``."""


def load_sampler_class(spec: str) -> type:
    """``package.module:ClassName`` (or ``package.module.ClassName``) -> the class."""
    module_name, sep, name = spec.partition(":")
    if not sep:
        module_name, _, name = spec.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"replay.sampler {spec!r}: expected 'package.module:ClassName'")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"replay.sampler {spec!r} cannot be loaded: {exc}") from exc


class ReplayBufferAsync(ReplayBufferBase[QueueingReplica]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._target = 0
        self._next_replica = 0
        self._sampled: set[str] = set()
        self._versions: dict[str, int] = {}
        self._has_gradient: dict[str, bool] = {}
        self._counts: Counter[str] = Counter()
        self._staleness: list[int] = []
        self._wait_seconds = 0.0
        self._depth = 0
        self._failed_while_waiting = 0
        self._assigned: dict[str, int] = {}
        """prompt group -> the replica it was queued on (to re-queue it if that replica dies)."""
        self._awaiting: list[str] = []
        """Finished groups whose scores are not all in yet (``streaming``), at the last scan."""
        self._late: set[str] = set()
        """Groups seen waiting for their scores, until sampled or evicted: they hold no rollout slot."""
        self._late_ready = 0
        """Of those, the ones scored and not sampled yet, at the last scan."""
        self._hand_again_due = True
        """Hand the unscored groups to the reward workers at the next scan (a resumed run's)."""

    # -- dispatch ------------------------------------------------------------------------
    def dispatch(self, num_groups: int, step: int) -> list[str]:
        """Top up the groups outstanding to ``num_groups * (1 + prefetch_batches)``; never waits."""
        self._target = max(self._target, num_groups * (1 + self.cfg.prefetch_batches))
        return self._top_up(step)

    def _outstanding(self) -> list[str]:
        return [k for k in self.tq.query(PARTITION, kind="prompt") if k not in self._sampled]

    def _top_up(self, step: int) -> list[str]:
        """Draw what the target misses. Groups finished and waiting for their scores
        (``streaming``), or scored after waiting and not sampled yet, do not count, up to
        ``awaiting_scores_multiple`` targets: rollout goes on producing while scores lag, rather
        than idle until a late grader frees its slots or the trainer works through its burst."""
        cap = self._target * self.cfg.awaiting_scores_multiple
        lagging = min(len(self._awaiting) + self._late_ready, cap) if self.streaming else 0
        missing = self._target + lagging - len(self._outstanding())
        return [self._draw_one(step) for _ in range(max(missing, 0))]

    def _draw_one(self, step: int, enqueue: bool = True) -> str:
        """One prompt group: a pending record tagged with the version rollout serves now."""
        index, row = self.loader.next()
        key = f"p{index}"
        tags = {"kind": "prompt", "status": "pending", "step": step, "version": step - 1}
        self.tq.put(PARTITION, {key: dict(row, prompt_step=step)}, {key: tags})
        if enqueue:
            self._enqueue(key)
        self._counts["dispatched"] += 1
        return key

    def _enqueue(self, key: str) -> None:
        index = self._next_replica % len(self.rollouts)
        self._next_replica += 1
        self._assigned[key] = index
        self.rollouts[index].enqueue(PARTITION, [key], self.n, self.sampling)

    def _check_replicas(self) -> None:
        """A replica that died lost the prompts queued on it: once it is back (``revive``),
        they start over, their partial trajectories dropped, exactly as after a resume."""
        if self.revive is None:
            return
        restarted = set(self.revive())
        if not restarted:
            return
        self._counts["revived_replicas"] += len(restarted)
        lost = [k for k in self._outstanding() if self._assigned.get(k) in restarted]
        tags = self.tq.get_tags(PARTITION, lost)
        for key, tag in zip(lost, tags, strict=True):
            if tag["status"] in ("pending", "running"):
                self._reset(key)
                self._enqueue(key)
                self._counts["requeued_lost"] += 1

    # -- sample --------------------------------------------------------------------------
    def sample(self, num_groups: int, step: int) -> str:
        """Wait for ``num_groups`` sampleable groups (oldest first); returns the batch id."""
        self._target = max(self._target, num_groups * (1 + self.cfg.prefetch_batches))
        started = time.monotonic()
        rescued = False
        next_check = LIVENESS_CHECK_SECONDS
        while True:
            ready, blocked = self._scan(step)
            if not blocked and len(ready) >= num_groups:
                break
            waited = time.monotonic() - started
            if self._should_rescue(waited, rescued):
                self._rescue(num_groups - len(ready), step)
                rescued = True
                continue
            if waited > next_check:
                self._check_replicas()
                self._hand_again_due = True
                next_check = waited + LIVENESS_CHECK_SECONDS
            if waited > self.cfg.sample_timeout_seconds:
                raise SampleTimeoutError(
                    f"replay buffer: {len(ready)} of {num_groups} groups ready after {waited:.1f}s"
                    + (" (waiting on a prompt at the staleness limit)" if blocked else "")
                    + self._failures_note()
                )
            time.sleep(self.cfg.poll_interval_seconds)
        self._wait_seconds += time.monotonic() - started
        self._failed_while_waiting = 0
        groups = ready[:num_groups]
        self._sampled.update(groups)
        self._late_ready -= sum(g in self._late for g in groups)
        self._late.difference_update(groups)
        self._staleness += [(step - 1) - self._versions[g] for g in groups]
        self._depth = len(ready) - num_groups
        keys = trajectory_keys(groups, self.n)
        batch_id = f"step{step}-{uuid.uuid4().hex[:8]}"
        self.tq.put_batch(batch_id, PARTITION, keys, groups=groups, step=step)
        return batch_id

    def _should_rescue(self, waited: float, rescued: bool) -> bool:
        after = self.cfg.rescue_after_seconds
        return self.rescue is not None and after is not None and waited > after and not rescued

    def _rescue(self, missing: int, step: int) -> None:
        """Starvation: fresh groups, drawn one at a time, generated by the spare engine in place."""
        keys = [self._draw_one(step, enqueue=False) for _ in range(max(missing, 1))]
        assert self.rescue is not None
        self.rescue(keys)
        self._hand_to_scorers(keys)  # the spare engine hands nothing to the reward pool
        self._counts["rescue_activations"] += 1
        self._counts["rescue_groups"] += len(keys)

    def _scan(self, step: int) -> tuple[list[str], bool]:
        """Evict what must go, refill it, and return (sampleable groups oldest first, blocked)."""
        keys = self._outstanding()
        tags = self.tq.get_tags(PARTITION, keys)
        trainer_version = step - 1
        limit = self.cfg.max_off_policy_threshold
        finished, failed, blocked, unscored = [], [], False, set()
        for key, tag in zip(keys, tags, strict=True):
            if tag["status"] == "finished":
                finished.append(key)
                if self.streaming and not tag.get("scored"):
                    unscored.add(key)
            elif tag["status"] == "failure":
                failed.append(key)
            elif self.cfg.staleness_strategy == "wait":
                blocked |= spec_staleness(trainer_version, tag.get("version", trainer_version)) >= limit
        evicted = self._handle_failed(failed)
        versions = self._group_versions(finished)
        stale = [k for k in finished if spec_staleness(trainer_version, versions[k]) > limit]
        evicted += self._evict(stale, "staleness")  # both strategies: the bound holds
        ready = [k for k in finished if k in self._versions and k not in unscored]
        self._awaiting = [k for k in finished if k in self._versions and k in unscored]
        self._late.update(self._awaiting)
        self._late_ready = sum(k in self._late for k in ready)
        self._counts["awaiting_scores"] = max(self._counts["awaiting_scores"], len(self._awaiting))
        if self._hand_again_due:
            self._hand_to_scorers(self._awaiting)
            self._hand_again_due = False
        if self._awaiting:  # late scores hold no rollout slot
            self._top_up(step)
        if self.cfg.filter_groups:
            no_gradient = [k for k, ok in self._classify(ready).items() if not ok]
            evicted += self._evict(no_gradient, "filter")
            ready = [k for k in ready if k in self._versions]
        if evicted:
            self._counts["refill"] += len(self._top_up(step))
        order = {k: i for i, k in enumerate(keys)}
        return sorted(ready, key=lambda k: (self._versions[k], order[k])), blocked

    def _hand_to_scorers(self, groups: list[str]) -> None:
        """Hand ``groups`` to their reward workers to score in the background (``streaming``)."""
        if not self.streaming or not groups or not self.rewards:
            return
        for worker, owned in zip(self.rewards, groups_by_owner(groups, len(self.rewards)), strict=True):
            if owned:
                cast(StreamingScorer, worker).submit(PARTITION, owned, self.n)
        self._counts["handed_again"] += len(groups)

    def _group_versions(self, groups: list[str]) -> dict[str, int]:
        """Oldest token version of each finished group (from its trajectories' version tags)."""
        new = [g for g in groups if g not in self._versions]
        if new:
            tags = self.tq.get_tags(PARTITION, trajectory_keys(new, self.n))
            for i, group in enumerate(new):
                self._versions[group] = min(t["version"] for t in tags[i * self.n : (i + 1) * self.n])
        return {g: self._versions[g] for g in groups}

    def _classify(self, groups: list[str]) -> dict[str, bool]:
        """group -> has gradient (R-7.3); groups are scored once, on the reward pool if needed."""
        new = [g for g in groups if g not in self._has_gradient]
        metric = self.cfg.filter_groups_metric
        self._has_gradient.update(groups_with_gradient(self.tq, self.rewards, PARTITION, new, self.n, metric))
        return {g: self._has_gradient[g] for g in groups}

    def _failures_note(self) -> str:
        if not self._failed_while_waiting:
            return ""
        action = "refilled" if self.cfg.refill_failed_groups else "retried"
        return (
            f"; {self._failed_while_waiting} group(s) failed meanwhile and were {action}: rollout "
            "generation keeps failing (see rollout/generation_errors and the replicas' logs)"
        )

    def _handle_failed(self, groups: list[str]) -> int:
        """Evict failed groups (refilled), or retry the same prompts when refill is off."""
        self._failed_while_waiting += len(groups)
        if self.cfg.refill_failed_groups:
            return self._evict(groups, "failure")
        for group in groups:
            self._reset(group)
            self._enqueue(group)
            self._counts["retried_failure"] += 1
        return 0

    def _reset(self, group: str) -> None:
        """The group back to pending, without the trajectories a failed or lost attempt wrote."""
        existing = set(self.tq.query(PARTITION, group_id=group))
        self.tq.delete(PARTITION, [k for k in trajectory_keys([group], self.n) if k in existing])
        self.tq.set_tags(PARTITION, {group: {"status": "pending", "partial": False}})

    def _evict(self, groups: list[str], reason: str) -> int:
        if groups:
            self.tq.delete(PARTITION, groups + trajectory_keys(groups, self.n))
            for group in groups:
                self._versions.pop(group, None)
                self._has_gradient.pop(group, None)
                self._late.discard(group)
            self._counts[f"evicted_{reason}"] += len(groups)
        return len(groups)

    # -- after training ------------------------------------------------------------------
    def release(self, batch_id: str) -> None:
        """Forget a trained batch: its trajectories and prompts leave the queue."""
        batch = self.tq.get_batch(batch_id, ["groups"])
        self.tq.delete(PARTITION, batch["groups"])
        self.tq.drop_batch(batch_id)
        for group in batch["groups"]:
            self._sampled.discard(group)
            self._assigned.pop(group, None)
            self._versions.pop(group, None)
            self._has_gradient.pop(group, None)

    def pop_metrics(self) -> dict[str, float]:
        """Staleness, eviction, refill and waiting figures since the last call (R-7.6)."""
        stale = self._staleness or [0]
        metrics = {
            "replay/staleness_mean": sum(stale) / len(stale),
            "replay/staleness_max": float(max(stale)),
            "replay/queue_depth": float(self._depth),
            "replay/sample_wait_seconds": self._wait_seconds,
        }
        names = ("evicted_staleness", "evicted_filter", "evicted_failure", "refill", "retried_failure")
        for name in (*names, "requeued_lost", "rescue_activations", "rescue_groups"):
            metrics[f"replay/{name}"] = float(self._counts[name])
        if self.streaming:  # the most finished groups seen waiting for their scores at once
            metrics["replay/awaiting_scores_max"] = float(self._counts["awaiting_scores"])
            metrics["replay/handed_again"] = float(self._counts["handed_again"])
        metrics["rollout/revived_replicas"] = float(self._counts["revived_replicas"])
        for value in range(max(stale) + 1):
            metrics[f"replay/staleness_hist/{value}"] = float(stale.count(value))
        self._counts = Counter(dispatched=self._counts["dispatched"])
        self._staleness, self._wait_seconds = [], 0.0
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "loader_position": self.loader.position,
            "dispatched": self._counts["dispatched"],
            "target": self._target,
            "next_replica": self._next_replica,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._counts["dispatched"] = int(state.get("dispatched", 0))
        self._target = int(state.get("target", 0))
        self._next_replica = int(state.get("next_replica", 0))

    def requeue(self, keys: list[str], step: int) -> None:
        """The restored pending groups go back to the replicas, round robin, in their order."""
        for key in keys:
            self._enqueue(key)
