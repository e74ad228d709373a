"""Routing each sample to its reward by ``data_source`` (R-6.1), and infra retries (R-6.5).

A data_source is routed by ``reward.by_data_source`` (its exact name, then its longest prefix
before a '/'), then by the reward registry's own names the same way (so ``arith/...`` keeps
the arithmetic task's reward with no config at all), then to ``reward.default``. A row that
none of them routes is refused when the dataset is loaded, before the run starts.

Each reward is built once per router (a worker keeps one for its life) and scores all the
trajectories routed to it in one call (``score_all``: a batch where the reward takes one).
A result marked ``is_infra`` is scored again, up to ``reward.max_infra_retries`` times; one
still infra after that stays so, and the caller leaves it out of training.

A reward that holds a model (``ModelReward``) colocated with the rollout
(``reward.placement: colocate``) shares the rollout's device: it is put to sleep once built,
woken before each of its scorings and put back to sleep after (R-6.8), with the rollout
engines' sleep and wake contract. In a pool of its own it stays awake.

A worker may score several batches at once (``reward.max_concurrent_batches``), so the router
is called from several threads. A reward is entered by one thread at a time (a lock per reward)
unless it declares ``concurrent = True`` (a class attribute): its ``score_batch`` is then called
from several threads at once, and it must be safe so (the remote reward is: an HTTP client and a
thread pool). A reward that waits (on I/O, a remote endpoint) gains from declaring it; a
CPU-bound rule gains nothing either way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from rl_train.engines.reward.base import BatchReward, ModelReward, Reward, RewardResult, Trajectory, score_all
from rl_train.engines.reward.config import RewardConfig, RewardSettings
from rl_train.engines.reward.registry import REWARDS, build_reward
from rl_train.engines.sandbox import SandboxConfig
from rl_train.registry import UnknownNameError


def _by_prefix(data_source: str, names: object) -> str | None:
    """The longest of ``data_source`` and its '/' prefixes that is ``in names``."""
    parts = data_source.split("/")
    for cut in range(len(parts), 0, -1):
        name = "/".join(parts[:cut])
        if name in names:  # type: ignore[operator]
            return name
    return None


class RewardRouter:
    """The run's rewards, by data_source."""

    def __init__(self, reward: RewardConfig | None = None, sandbox: SandboxConfig | None = None) -> None:
        self.settings = RewardSettings(reward or RewardConfig(), sandbox or SandboxConfig())
        self._built: dict[str, Reward | BatchReward] = {}
        self._locks: dict[str, threading.Lock] = {}
        """One per reward not declared ``concurrent``: entered by one scoring thread at a time."""
        self._building = threading.Lock()
        """Builds each reward once, though two scoring threads ask for it first at once."""
        self.colocated = self.settings.reward.placement == "colocate"
        """Model rewards share the rollout's device: awake only while they score (R-6.8)."""

    def route(self, data_source: str) -> str:
        """The reward (a registered name or an import path) that scores ``data_source``."""
        config = self.settings.reward
        routed = _by_prefix(data_source, config.by_data_source)
        if routed is not None:
            return config.by_data_source[routed]
        named = _by_prefix(data_source, REWARDS)
        if named is not None:
            return named
        if config.default is not None:
            return config.default
        raise UnknownNameError(
            f"no reward for data_source {data_source!r}: name it in reward.by_data_source or set "
            f"reward.default, or use a data_source a registered reward is named by ({', '.join(REWARDS.names())})"
        )

    def build_configured(self) -> None:
        """Build every reward the config names now, so that a worker fails at its start (a
        user's module that does not import there, a sandbox that cannot start), not mid-run."""
        for name in sorted(self.settings.reward.names()):
            self.reward(name)

    def reward(self, name: str) -> Reward | BatchReward:
        """The reward ``name``, built at first use (a sandboxed one checks its sandbox then)."""
        with self._building:
            if name not in self._built:
                built = build_reward(name, self.settings)
                if self.colocated and isinstance(built, ModelReward):
                    built.sleep()  # the rollout's device is the rollout's until this reward scores
                self._locks[name] = threading.Lock()
                self._built[name] = built
            return self._built[name]

    def exclusive(self, name: str) -> AbstractContextManager[object]:
        """Held around each call of reward ``name``: its lock, unless it declares ``concurrent``."""
        if getattr(self.reward(name), "concurrent", False) is True:
            return nullcontext()
        return self._locks[name]

    @contextmanager
    def awake(self, reward: Reward | BatchReward) -> Iterator[None]:
        """A colocated model reward awake for one scoring, asleep again after, whatever happens."""
        if not (self.colocated and isinstance(reward, ModelReward)):
            yield
            return
        reward.wake_up()
        try:
            yield
        finally:
            reward.sleep()

    def score(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One result per trajectory, in order, each by its data_source's reward; infra results
        scored again up to ``reward.max_infra_retries`` times."""
        results: list[RewardResult | None] = [None] * len(trajectories)
        todo = list(range(len(trajectories)))
        for _ in range(self.settings.reward.max_infra_retries + 1):
            for i, result in zip(todo, self._score_once([trajectories[i] for i in todo]), strict=True):
                results[i] = result
            todo = [i for i in todo if results[i].is_infra]  # type: ignore[union-attr]
            if not todo:
                break
        return [r for r in results if r is not None]

    def _score_once(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        by_reward: dict[str, list[int]] = {}
        for i, trajectory in enumerate(trajectories):
            by_reward.setdefault(self.route(trajectory.data_source), []).append(i)
        results: list[RewardResult | None] = [None] * len(trajectories)
        for name, indices in by_reward.items():
            reward = self.reward(name)
            with self.exclusive(name), self.awake(reward):
                scored = score_all(reward, [trajectories[i] for i in indices], f"reward {name!r}")
            for i, result in zip(indices, scored, strict=True):
                results[i] = result
        return [r for r in results if r is not None]
