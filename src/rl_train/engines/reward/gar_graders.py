"""Group graders for GAR (R-6.6): the ``GROUP_GRADERS`` table, a user's by import path, and the
built-in ``brevity`` grader.

``reward.gar.grader`` names one: a registered name, or ``"package.module:attr"``, a function
``(trajectories, results) -> list[GroupVerdict] | GroupInfra`` or a class built once per
reward worker with ``Class.from_settings(gar_config)`` where it has that classmethod, else
``Class()``. The reward worker calls it on each whole prompt group it scores (``GroupGrading``)
and writes the verdicts on the records (``GAR_FIELDS``); the advantage phase reads them there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rl_train.engines.reward.base import (
    GroupInfra,
    GroupReward,
    GroupVerdict,
    RewardResult,
    Trajectory,
    check_verdicts,
)
from rl_train.engines.reward.registry import check_import_path
from rl_train.registry import Entry, Registry, UnknownNameError, resolve

if TYPE_CHECKING:
    from rl_train.engines.reward.config import GarConfig

GROUP_GRADERS: Registry[Entry[Any]] = Registry(
    "group grader",
    "reward.gar.grader",
    {
        "brevity": Entry(
            "rl_train.engines.reward.gar_graders:Brevity",
            "Quality: the shortest passing answer's length over this one's; hacking: a passing answer "
            "stating the ground truth reward.gar.max_answer_repeats times or more.",
        ),
    },
)

ALLOWED = "available: {names}, or a function or class by import path 'package.module:function_or_Class'"


def passes(result: RewardResult, threshold: float) -> bool:
    """A trajectory passes its task when it has a real score of at least ``threshold``."""
    return not result.is_infra and result.score >= threshold


class Brevity:
    """Among a group's passing answers the shortest is the best (quality 1); a longer one's
    quality is the shortest's length over its own, floored at ``min_quality``. A passing answer
    that states the ground truth ``max_answer_repeats`` times or more is flagged as hacking:
    it passes a last-number or contains-the-answer rule by listing the answer over and over,
    not by solving the task. Lengths are characters of the graded text, blanks around it
    stripped; failing and infra answers get quality 1 (GAR does not reshape them)."""

    def __init__(
        self, pass_threshold: float = 1.0, min_quality: float = 0.25, max_answer_repeats: int = 3
    ) -> None:
        self.pass_threshold = pass_threshold
        self.min_quality = min_quality
        self.max_answer_repeats = max_answer_repeats

    @classmethod
    def from_settings(cls, gar: GarConfig) -> Brevity:
        return cls(gar.pass_threshold, gar.min_quality, gar.max_answer_repeats)

    def __call__(
        self, trajectories: Sequence[Trajectory], results: Sequence[RewardResult]
    ) -> list[GroupVerdict]:
        passing = [passes(r, self.pass_threshold) for r in results]
        lengths = [max(len(t.graded_text.strip()), 1) for t in trajectories]
        shortest = min((n for n, p in zip(lengths, passing, strict=True) if p), default=1)
        return [
            GroupVerdict(
                max(self.min_quality, min(1.0, shortest / n)), self._repeats(t) >= self.max_answer_repeats
            )
            if p
            else GroupVerdict()
            for t, n, p in zip(trajectories, lengths, passing, strict=True)
        ]

    @staticmethod
    def _repeats(trajectory: Trajectory) -> int:
        """How often the ground truth stands alone in the graded text (not inside a longer word or number)."""
        truth = trajectory.ground_truth.strip()
        if not truth:
            return 0
        return len(re.findall(rf"(?<![\w.]){re.escape(truth)}(?![\w.])", trajectory.graded_text))


def check_grader(value: str) -> str:
    """``value`` if it names a group grader (registered, or an importable callable); else a
    ``ValueError`` saying what is wrong and what is allowed (for the config's validator)."""
    if ":" not in value:
        if value in GROUP_GRADERS:
            return value
        raise UnknownNameError(
            f"got {value!r}: unknown group grader; {ALLOWED.format(names=', '.join(GROUP_GRADERS.names()))}"
        )
    return check_import_path(
        value, "a group grader is a function (trajectories, results) -> list[GroupVerdict] | GroupInfra"
    )


def build_grader(gar: GarConfig) -> GroupReward:
    """The grader ``gar.grader`` names, ready to grade."""
    if gar.grader is None:
        raise ValueError("reward.gar.grader is not set: groupwise grading is off")
    target = GROUP_GRADERS.get(gar.grader) if gar.grader in GROUP_GRADERS else resolve(gar.grader)
    if isinstance(target, type):
        from_settings = getattr(target, "from_settings", None)
        built: Any = from_settings(gar) if callable(from_settings) else target()
        return built
    grader: GroupReward = target
    return grader


GAR_FIELDS = ["gar_quality", "gar_hacking", "gar_infra"]
"""What a graded group's trajectories carry: the quality factor, the hacking flag, and why the
grader failed ("" when it gave a verdict; then quality 1 and no flag)."""
PREVIOUS_FIELDS = ["reward", "is_infra", *GAR_FIELDS]
"""What the reward worker reads of an earlier scoring, to grade a group only once."""


class GroupGrading:
    """Grades the whole prompt groups of a batch the routed reward has just scored.

    A group is graded only when all its ``group_size`` trajectories are in the batch (a
    grader compares them), and once: a group already graded on the same per-sample results
    keeps its verdict (the async modes' group filter scores a group before the reward phase
    scores it again), so a costly grader runs once per group. A failed grader (``GroupInfra``)
    leaves the group's advantages alone; it is graded again the next time it is scored."""

    def __init__(self, gar: GarConfig, group_size: int) -> None:
        self.grader = build_grader(gar)
        self.where = f"group grader {gar.grader!r}"
        self.group_size = group_size

    def fields(
        self,
        group_ids: Sequence[str],
        trajectories: Sequence[Trajectory],
        results: Sequence[RewardResult],
        previous: Sequence[Mapping[str, Any]],
    ) -> list[dict[str, Any]]:
        """What to write on each trajectory ({} where nothing is to be written)."""
        members: dict[str, list[int]] = {}
        for i, group in enumerate(group_ids):
            members.setdefault(group, []).append(i)
        out: list[dict[str, Any]] = [{} for _ in group_ids]
        for rows in members.values():
            if len(rows) != self.group_size or all(_graded_on(previous[i], results[i]) for i in rows):
                continue
            verdicts = check_verdicts(
                self.grader([trajectories[i] for i in rows], [results[i] for i in rows]),
                len(rows),
                self.where,
            )
            for j, i in enumerate(rows):
                if isinstance(verdicts, GroupInfra):
                    out[i] = {
                        "gar_quality": 1.0,
                        "gar_hacking": False,
                        "gar_infra": verdicts.reason or "grader failed",
                    }
                else:
                    out[i] = {
                        "gar_quality": verdicts[j].quality,
                        "gar_hacking": verdicts[j].hacking,
                        "gar_infra": "",
                    }
        return out


def _graded_on(previous: Mapping[str, Any], result: RewardResult) -> bool:
    """The record holds a verdict given on this very result."""
    return (
        previous.get("gar_quality") is not None
        and previous.get("gar_infra") == ""
        and previous.get("reward") == result.score
        and bool(previous.get("is_infra", False)) == result.is_infra
    )
