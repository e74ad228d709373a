"""The advantage phase's pure part: TransferQueue records in, per-record field updates out.

Records hold response-only per-token lists (``rollout_log_probs``, ``old_log_probs``, optional
``ref_log_probs`` and ``response_mask``) plus a scalar ``reward`` and a ``group_id``. Per step:

1. rollout correction (R-7.4-7.6) against the rollout engine's log-probs: RS edits the response
   mask, IS yields per-token weights for the policy loss, and ``rollout_corr/*`` metrics come
   out every step (whenever rollout log-probs exist, even with IS and RS off);
2. the outcome reward on the last response token, minus ``beta * KL(old || ref)`` per kept token
   when ``algorithm.kl_in_reward`` is on (fixed or adaptive controller, state kept across steps);
3. with ``algorithm.overlong_filter``, a trajectory cut at the length limit trains no token
   (DAPO's overlong filtering): its reward still counts in its group's baseline, like a
   rejected sample's; with ``algorithm.overlong_penalty``, such a trajectory's score is
   lowered by it before the advantage (the reported reward stays the task's);
4. the registered advantage estimator, its result zeroed outside the RS mask. What it reads
   beyond rewards comes from the records as the estimator declares (``EstimatorNeeds``):
   critic ``values`` (GAE, which then also writes ``returns`` for the critic update) or each
   trajectory's ``baseline_reward`` (ReMax's greedy baseline). A sample marked ``is_infra``
   (its grader failed, R-6.5) is left out of the estimator as if absent from its group, and
   trains no token (its response mask is written as zeros).
5. with ``reward.gar`` (``gar_pass_threshold`` set), groupwise grading (R-6.6, ``algorithms/gar``):
   the hackers a group grader flagged score 0 in the estimator's input, and the positive
   advantages of each graded group's passers are redistributed by their quality factors
   (``gar/*`` metrics).

Like verl, a rejected token or sequence keeps its outcome reward in the estimator's input, so a
rejected sample still counts in its group's baseline; it is only its own advantage (and so its
gradient) that RS removes. Everything here is torch on small tensors; no Ray, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_train.algorithms.advantage import ADV_ESTIMATORS, EstimatorNeeds, estimator_needs
from rl_train.algorithms.advantage_base import AdvantageFn, AdvantageInputs, estimate_excluding
from rl_train.algorithms.config import AlgorithmConfig
from rl_train.algorithms.gar import grades_from_records, reshape_batch
from rl_train.algorithms.kl_controller import KLController, apply_kl_penalty_to_rewards, build_kl_controller
from rl_train.algorithms.reward_placement import place_on_last_token
from rl_train.algorithms.rollout_correction import (
    RolloutCorrectionPlan,
    bypass_old_log_prob,
    compute_rollout_correction,
)
from rl_train.algorithms.rollout_metrics import RunbookMonitor


@dataclass
class AdvantagePhase:
    """Everything the advantage phase decides once per run, and the state it keeps across steps."""

    estimator: AdvantageFn
    algorithm: AlgorithmConfig
    correction: RolloutCorrectionPlan
    kl_controller: KLController | None
    """Set only with ``algorithm.kl_in_reward``; adaptive controllers carry beta across steps."""
    kl_penalty: str
    needs: EstimatorNeeds = field(default_factory=EstimatorNeeds)
    """What the estimator reads beyond rewards (critic values, greedy baselines)."""
    monitor: RunbookMonitor = field(default_factory=RunbookMonitor)
    """R-10.3 runbook warnings; one per run so that "rising" trends span steps."""
    gar_pass_threshold: float | None = None
    """``reward.gar.pass_threshold`` when groupwise grading is on (None: off)."""

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig, gar_pass_threshold: float | None = None) -> AdvantagePhase:
        return cls(
            gar_pass_threshold=gar_pass_threshold,
            estimator=ADV_ESTIMATORS.get(algorithm.adv_estimator),
            algorithm=algorithm,
            correction=RolloutCorrectionPlan.from_config(algorithm.rollout_correction),
            kl_controller=build_kl_controller(algorithm.kl_ctrl) if algorithm.kl_in_reward else None,
            kl_penalty=algorithm.kl_penalty,
            needs=estimator_needs(algorithm.adv_estimator),
        )

    def state_dict(self) -> dict[str, Any]:
        """What the phase carries across steps (a checkpoint): the adaptive KL coefficient and
        the runbook's trend windows."""
        return {
            "kl_coef": None if self.kl_controller is None else self.kl_controller.value,
            "runbook": self.monitor.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.kl_controller is not None and state.get("kl_coef") is not None:
            self.kl_controller.value = float(state["kl_coef"])
        self.monitor.load_state_dict(state.get("runbook", {}))

    def compute(self, records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """-> (fields to write back, one dict per record; metrics). See the module docstring."""
        mask = pad_response(records, "response_mask", fill=1.0)
        old = pad_response(records, "old_log_probs")
        weights, kept, metrics = compute_rollout_correction(
            old, optional_field(records, "rollout_log_probs"), mask, self.correction
        )
        scores = torch.tensor([float(r["reward"]) for r in records])
        grades = None
        if self.gar_pass_threshold is not None:  # a flagged hacker scores 0 (R-6.6 step 1)
            grades, failed_groups = grades_from_records(records, self.gar_pass_threshold)
            scores = grades.effective_scores(scores)
            metrics["gar/hacking_flagged"] = float(grades.hacked.sum())
            metrics["gar/infra_groups"] = float(failed_groups)
        if self.algorithm.overlong_filter or self.algorithm.overlong_penalty:
            cut = is_cut(records)
            if self.algorithm.overlong_filter:  # the cut rows train no token
                kept = kept * (~cut).to(kept.dtype).unsqueeze(1)
                metrics["response_length/overlong_filtered"] = float(cut.float().mean())
            if self.algorithm.overlong_penalty:  # their scores drop, for the advantage only
                scores = scores - self.algorithm.overlong_penalty * cut.to(scores.dtype)
                metrics["response_length/overlong_penalized"] = float(cut.float().mean())
        rewards = place_on_last_token(scores, mask)
        if self.kl_controller is not None:
            ref = optional_field(records, "ref_log_probs")
            if ref is None:
                raise ValueError("algorithm.kl_in_reward needs ref_log_probs: the ref phase must run first")
            rewards, kl_metrics = apply_kl_penalty_to_rewards(
                rewards, old, ref, kept, self.kl_controller, self.kl_penalty
            )
            metrics.update(kl_metrics)
        inputs = AdvantageInputs(
            rewards,
            mask,
            [r["group_id"] for r in records],
            values=self._critic_values(records),
            reward_baselines=self._reward_baselines(records),
        )
        infra = torch.tensor([bool(r.get("is_infra", False)) for r in records], dtype=torch.bool)
        if bool(infra.any()):  # no verdict: no gradient, and no place in its group's statistics
            kept = kept * (~infra).to(kept.dtype).unsqueeze(1)
        advantages, returns = estimate_excluding(self.estimator, inputs, infra, self.algorithm)
        if grades is not None:  # the passers' positive mass redistributed by quality (step 2)
            advantages, reshaped = reshape_batch(advantages, mask, inputs.group_ids, grades)
            metrics["gar/groups_reshaped"] = float(reshaped)
        advantages = advantages * kept
        updates: list[dict[str, Any]] = [{"advantages": a} for a in unpad_response(advantages, records)]
        if self.needs.critic:  # the critic update's targets
            for update, r in zip(updates, unpad_response(returns, records), strict=True):
                update["returns"] = r
        if self.correction.rs_rules or self.algorithm.overlong_filter or bool(infra.any()):
            for update, m in zip(updates, unpad_response(kept, records), strict=True):
                update["response_mask"] = m
        if weights is not None:
            for update, w in zip(updates, unpad_response(weights, records), strict=True):
                update["rollout_is_weights"] = w
        graded = advantages[kept > 0]
        metrics["advantage/mean"] = float(graded.mean()) if graded.numel() else 0.0
        metrics["advantage/abs_mean"] = float(graded.abs().mean()) if graded.numel() else 0.0
        self.monitor.check(metrics)
        return updates, metrics

    def _critic_values(self, records: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        if not self.needs.critic:
            return None
        values = optional_field(records, "values")
        if values is None:
            raise ValueError(
                f"adv_estimator {self.algorithm.adv_estimator!r} needs critic values on every record: "
                "the values phase must run first"
            )
        return values

    def _reward_baselines(self, records: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        if not self.needs.greedy_baseline:
            return None
        if any("baseline_reward" not in r for r in records):
            raise ValueError(
                f"adv_estimator {self.algorithm.adv_estimator!r} needs baseline_reward on every record: "
                "the greedy_baseline phase must run first"
            )
        return torch.tensor([float(r["baseline_reward"]) for r in records])


def bypass_old_log_probs(records: Sequence[dict[str, Any]]) -> list[list[float]]:
    """bypass_mode (R-7.1): each record's rollout log-probs, to be stored as its old_log_probs."""
    rollout = optional_field(records, "rollout_log_probs")
    return unpad_response(bypass_old_log_prob(rollout), records)


def generated_wholly_at(records: Sequence[dict[str, Any]], version: int) -> list[int]:
    """Indices of the records whose every response token was sampled by weights ``version``
    (``token_versions``), with a rollout log-prob for each: under ``bypass_current_version``
    their old_log_probs are those log-probs. A record marked ``off_version`` is never one: its
    weights were not exactly the version they were tagged with (the starvation rescue's spare
    engine, or a replica revived mid-step, sample with the trainer's current weights, which
    after local update 0 are no longer pi_old's)."""
    return [
        i
        for i, r in enumerate(records)
        if not r.get("off_version")
        and r.get("token_versions")
        and len(r["token_versions"]) == len(r["response_ids"]) == len(r.get("rollout_log_probs") or ())
        and all(v == version for v in r["token_versions"])
    ]


def optional_field(records: Sequence[dict[str, Any]], name: str) -> torch.Tensor | None:
    """``pad_response`` of a field every record has, or None when any record lacks it."""
    if any(r.get(name) is None or len(r[name]) != len(r["response_ids"]) for r in records):
        return None
    return pad_response(records, name)


def pad_response(records: Sequence[dict[str, Any]], name: str, fill: float | None = None) -> torch.Tensor:
    """[B, T] float: each record's response-only list, right-padded with zeros.

    With ``fill``, a record without the field gets ``fill`` on its response tokens. The values
    of all records are gathered into one list and written with one masked assignment (one
    small tensor write per record cost about 10 ms a field at 1,024 records)."""
    lengths = [len(r["response_ids"]) for r in records]
    flat: list[float] = []
    for record, length in zip(records, lengths, strict=True):
        values = record.get(name) if fill is not None else record[name]
        if values is None:
            if fill is None:
                raise ValueError(f"record field {name!r} is None (a list of {length} values was expected)")
            flat.extend([fill] * length)
            continue
        values = values.tolist() if hasattr(values, "tolist") else list(values)
        if len(values) != length:
            raise ValueError(f"record field {name!r}: {len(values)} values for a response of {length} tokens")
        flat.extend(values)
    out = torch.zeros((len(records), max(lengths, default=1)))
    held = torch.arange(out.shape[1])[None, :] < torch.tensor(lengths, dtype=torch.long)[:, None]
    out[held] = torch.tensor(flat, dtype=out.dtype)
    return out


def unpad_response(values: torch.Tensor, records: Sequence[dict[str, Any]]) -> list[list[float]]:
    """The inverse of ``pad_response``: each row cut back to its record's response length."""
    rows = values.tolist()
    return [row[: len(r["response_ids"])] for row, r in zip(rows, records, strict=True)]


def is_cut(records: Sequence[dict[str, Any]]) -> torch.Tensor:
    """[B] bool: which trajectories were cut at the length limit."""
    return torch.tensor([r.get("stop_reason") == "length" for r in records], dtype=torch.bool)
