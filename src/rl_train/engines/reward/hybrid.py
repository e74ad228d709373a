"""A hybrid reward stack (R-6.7): rule, model and judge rewards combined by a declared formula.

The formula and its config are in ``hybrid_config.py``. Scoring is in two passes over the
batch: first the components some gate reads (on every trajectory), then each other component
on the trajectories whose gates are open, so an expensive grader behind a cheap rule sees only
the answers the rule passed. Each component scores its trajectories in one call (a batch where
it takes one: a reward model's forward, a judge's decode). Component rewards are built through
``build_reward``, which keeps one instance per name under the run's settings: a reward model
named by a route and by a hybrid's component is loaded once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rl_train.engines.reward.base import BatchReward, Reward, RewardResult, Trajectory, score_all
from rl_train.engines.reward.config import RewardSettings
from rl_train.engines.reward.hybrid_config import HybridConfig
from rl_train.engines.reward.registry import build_reward

Scores = dict[str, RewardResult | None]
"""One trajectory's component results so far, by component (None: gated off, not scored)."""


class HybridReward:
    """The reward ``reward.hybrid.<name>`` declares; a ``BatchReward``."""

    def __init__(self, name: str, config: HybridConfig, components: Mapping[str, Reward | BatchReward]) -> None:
        self.name, self.config, self.components = name, config, dict(components)
        self._first = [c for c in config.components if c not in config.gated()]
        """Components scored on every trajectory (the ungated; every gate reads one of them)."""
        self._then = [c for c in config.components if c in config.gated()]

    @classmethod
    def from_config(cls, name: str, config: HybridConfig, settings: RewardSettings) -> HybridReward:
        return cls(name, config, {c: build_reward(r, settings) for c, r in config.components.items()})

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        scores: list[Scores] = [dict.fromkeys(self.config.components) for _ in trajectories]
        for component in self._first:
            self._score(component, trajectories, scores, range(len(trajectories)))
        for component in self._then:
            self._score(component, trajectories, scores, [i for i, s in enumerate(scores) if self._open(component, s)])
        return [self._combine(s) for s in scores]

    def _score(self, component: str, trajectories: Sequence[Trajectory], scores: list[Scores], indices: Sequence[int]) -> None:
        if not indices:
            return
        where = f"reward {self.name!r}, component {component!r} ({self.config.components[component]!r})"
        results = score_all(self.components[component], [trajectories[i] for i in indices], where)
        for i, result in zip(indices, results, strict=True):
            scores[i][component] = result

    def _open(self, component: str, scores: Scores) -> bool:
        """Whether every gate of ``component`` is open (a gate that reads an infra result is
        not: the sample is infra anyway, and its grader need not run)."""
        for gate in self.config.gates:
            if gate.component == component:
                required = scores[gate.requires]
                if required is None or required.is_infra or required.score < gate.at_least:
                    return False
        return True

    def _combine(self, scores: Scores) -> RewardResult:
        sub_scores: dict[str, float] = {}
        total, failed = 0.0, []
        for component, result in scores.items():
            if result is not None and result.is_infra:
                failed.append(f"{component}: {result.reason}")
                continue
            value = 0.0 if result is None else result.score
            sub_scores[component] = value
            sub_scores.update((f"{component}.{sub}", v) for sub, v in (result.sub_scores if result else {}).items())
            total += self.config.weight(component) * value
        if failed:
            return RewardResult.infra(f"hybrid {self.name!r}: " + "; ".join(failed), sub_scores)
        if self.config.clip is not None:
            total = min(max(total, self.config.clip[0]), self.config.clip[1])
        return RewardResult(total, sub_scores)
