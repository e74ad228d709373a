"""The ``reward:`` config section: which reward scores each data source, and its settings."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.reward.gar_graders import check_grader
from rl_train.engines.reward.hybrid_config import HybridConfig
from rl_train.engines.reward.judge_config import JudgeConfig
from rl_train.engines.reward.model_config import RewardModelConfig
from rl_train.engines.reward.registry import REWARDS, check_reward
from rl_train.engines.reward.remote_config import RemoteRewardConfig
from rl_train.engines.sandbox import SandboxConfig

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward, Reward


class DefinedReward(Protocol):
    """A reward defined by name in a section of ``reward:`` (a reward model, a judge, a remote
    grader, a hybrid stack): the section's entry builds it (importing its implementation only
    then, in the worker that scores with it)."""

    holds_model: ClassVar[bool]
    """Its reward holds a model on a device (a ``ModelReward``: a reward model, a judge): where it
    sits matters (``reward.placement``), and separate_async wants it in a pool of its own (R-2.6)."""

    def build(self, name: str, settings: RewardSettings) -> Reward | BatchReward: ...


@runtime_checkable
class ComposedReward(Protocol):
    """A defined reward made of other rewards (a hybrid stack): the names it uses are checked at
    config load like the routes' (known, and no reward containing itself)."""

    def references(self) -> Mapping[str, str]:
        """Dotted path below the entry -> the reward name found there."""
        ...


DEFINING_SECTIONS: tuple[str, ...] = ("models", "judges", "remote", "hybrid")
"""The fields of ``RewardConfig`` that define rewards by name (each a ``dict[str, DefinedReward]``);
a name they define is routed like a registered one."""


class NumericConfig(StrictModel):
    rel_tol: float = Field(1e-6, ge=0)
    """numeric and math rewards: relative tolerance of a numeric match (exact numbers equal always match)."""
    abs_tol: float = Field(1e-9, ge=0)
    """numeric and math rewards: absolute tolerance of a numeric match."""


class CodeTestsConfig(StrictModel):
    tests_field: str = "tests"
    """code_tests: the row's column holding its tests: a list of snippets (each one test, e.g. an assert) or one test program (one test)."""
    scoring: Literal["fraction", "all"] = "fraction"
    """code_tests: the score is the fraction of tests passed, or 1 only when all pass (all)."""
    timeout_s: float = Field(10.0, gt=0)
    """code_tests: wall-clock limit of one response's run (its code and all its tests), seconds; memory, processes and files are the sandbox section's."""
    test_timeout_s: float = Field(2.0, gt=0)
    """code_tests: limit of one test, seconds; a test past it fails and the next one runs."""
    max_parallel: int = Field(4, ge=1)
    """code_tests: sandboxes one reward worker runs at once (each response's run is one)."""
    max_output_bytes: int = Field(64 << 10, ge=1024)
    """code_tests: what is read of the run's stdout and stderr, bytes each (the verdicts are a few bytes per test)."""
    prefix_field: str | None = None
    """code_tests: the row's column whose text goes before the response's code, as is (the start of a function the policy completes; 'prompt' is the row's prompt); None: the response's code runs alone."""
    cache_size: int = Field(0, ge=0)
    """code_tests: verdicts kept by (program, tests), so a program already judged against the same tests is not run again, in one batch or a later one; assumes the tests are deterministic (the same program always gets the same verdict). 0: off."""


class GarConfig(StrictModel):
    """Groupwise grading (GAR, R-6.6): a group grader's quality factors and hacking flags reshape each prompt group's advantages."""

    grader: str | None = None
    """The group grader (None: GAR off): a registered one (brevity) or a function or class by import path ('my_pkg.graders:clarity'); it sees each whole prompt group with its rewards and returns a quality factor and a hacking flag per trajectory."""
    pass_threshold: float = 1.0
    """A trajectory passes its task when its reward is at least this; GAR reshapes the positive advantages of passers only."""
    min_quality: float = Field(0.25, gt=0, le=1)
    """brevity grader: the lowest quality a passing answer gets, however long it is."""
    max_answer_repeats: int = Field(3, ge=2)
    """brevity grader: a passing answer that states the ground truth this many times or more is flagged as reward hacking."""

    @field_validator("grader")
    @classmethod
    def _known_grader(cls, value: str | None) -> str | None:
        return None if value is None else check_grader(value)

    @property
    def on(self) -> bool:
        return self.grader is not None


class RewardConfig(StrictModel):
    num_workers: int = Field(1, ge=1)
    """Reward worker actors; samples are spread across them (each prompt group whole to one)."""
    streaming: bool = False
    """Score each prompt group as soon as rollout finishes it, in the background on the reward workers, rather than in the reward phase; a group is sampled once all its scores are in, and late scores never hold rollout up (on by default in the async modes)."""
    max_concurrent_batches: int = Field(4, ge=1)
    """Batches a reward worker scores at once in the background (reward.streaming), each on a thread of its own: a grader that waits (a remote endpoint, a judge's engine) overlaps its batches; a reward is still entered by one thread at a time unless it declares `concurrent = True`; 1: one batch at a time."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the reward workers run: cuda gives each a GPU (a whole one in its own pool, a share of a rollout replica's when colocated); a rule reward needs none."""
    placement: Literal["own_pool", "colocate"] = "own_pool"
    """own_pool: the reward workers have devices of their own; colocate: each shares a rollout replica's device, and a model-based reward (reward.models, reward.judges) is woken before each scoring and put to sleep after (R-6.8). separate_async requires own_pool for a model-based reward (R-2.6)."""
    # The sections that define rewards by name (DEFINING_SECTIONS) go here, above the routes
    # that name them: the routes' validator reads them.
    models: dict[str, RewardModelConfig] = Field(default_factory=dict)
    """Discriminative reward models (HF sequence classifiers) by name, routed like registered rewards: reward.models.my_rm.path=..., reward.by_data_source.arith=my_rm."""
    judges: dict[str, JudgeConfig] = Field(default_factory=dict)
    """Generative judges by name: a model decodes a verdict on each trajectory through a rollout engine of its own, a parser reads its score (engines/reward/judge.py documents the template and parsers); routed by name in by_data_source / default."""
    remote: dict[str, RemoteRewardConfig] = Field(default_factory=dict)
    """Rewards behind an HTTP endpoint by name (e.g. `rl-train serve-reward`; engines/reward/wire.py documents the JSON it speaks); routed by name in by_data_source / default."""
    hybrid: dict[str, HybridConfig] = Field(default_factory=dict)
    """Hybrid stacks by name, each routable in by_data_source: components (other rewards) combined by weights, gates and a clip (engines/reward/hybrid_config.py)."""
    by_data_source: dict[str, str] = Field(default_factory=dict)
    """Reward per data_source (its exact name, or its longest prefix before a '/'): a registered reward or a function or class by import path ('my_pkg.rewards:unit_tests')."""
    default: str | None = None
    """The reward of a data_source that neither by_data_source nor the reward registry names (None: such a row is refused at start)."""
    max_infra_retries: int = Field(2, ge=0)
    """Times a sample whose grader failed (is_infra: a sandbox that did not start, a crashed harness) is scored again before it is left out of training."""
    numeric: NumericConfig = Field(default_factory=NumericConfig)
    """Tolerances of the numeric and math rewards."""
    code_tests: CodeTestsConfig = Field(default_factory=CodeTestsConfig)
    """The code_tests reward: where the tests are, how they score, time limits."""
    gar: GarConfig = Field(default_factory=GarConfig)
    """Groupwise grading (GAR, R-6.6), off unless reward.gar.grader is set."""

    @field_validator("by_data_source", "default")
    @classmethod
    def _known_rewards(cls, value: dict[str, str] | str | None, info: ValidationInfo) -> dict[str, str] | str | None:
        # the defining sections are declared above the routes, so they are validated first
        defined = {name for section in DEFINING_SECTIONS for name in info.data.get(section, {})}
        routes = {"": value} if isinstance(value, str) else dict(value or {})
        for source, name in routes.items():
            if name in defined:
                continue
            try:
                check_reward(name)
            except ValueError as error:
                hint = f"; or one this config defines ({', '.join(sorted(defined))})" if defined else ""
                raise ValueError(f"{source!r}: {error}{hint}" if source else f"{error}{hint}") from None
        return value

    @model_validator(mode="after")
    def _defined_names(self) -> RewardConfig:
        for section in DEFINING_SECTIONS:
            for name in getattr(self, section):
                if ":" in name or name in REWARDS:
                    raise ValueError(
                        f"reward.{section}.{name}: a defined reward's name may not contain ':' nor be a "
                        f"registered reward's ({', '.join(REWARDS.names())})"
                    )
        self._check_references()
        return self

    def _check_references(self) -> None:
        """Every reward a composed reward names is known, and none contains itself (the error
        names the dotted path of the reference that closes the loop)."""
        defined = self.defined()
        uses: dict[str, list[tuple[str, str]]] = {}
        for section in DEFINING_SECTIONS:
            for name, entry in getattr(self, section).items():
                if not isinstance(entry, ComposedReward):
                    continue
                for path, used in entry.references().items():
                    where = f"reward.{section}.{name}.{path}"
                    if used not in defined:
                        try:
                            check_reward(used)
                        except ValueError as error:
                            raise ValueError(f"{where}: {error}; or one this config defines ({', '.join(sorted(defined))})") from None
                    uses.setdefault(name, []).append((where, used))
        for name in uses:
            _find_cycle(name, [name], uses)

    def uses(self, names: AbstractSet[str]) -> set[str]:
        """``names`` and every reward the composed ones among them use, all the way down (what a
        run that routes to ``names`` scores with: the code_tests reward inside a hybrid runs code)."""
        found, todo, defined = set(), list(names), self.defined()
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                entry = defined.get(name)
                if isinstance(entry, ComposedReward):
                    todo += entry.references().values()
        return found

    def defined(self) -> Mapping[str, DefinedReward]:
        """The rewards the config's sections define, by name."""
        found: dict[str, DefinedReward] = {}
        for section in DEFINING_SECTIONS:
            for name, entry in getattr(self, section).items():
                if name in found:
                    raise ValueError(f"reward.{section}.{name}: the name {name!r} is defined twice in reward:")
                found[name] = entry
        return found

    def model_rewards(self) -> list[str]:
        """The dotted paths of the rewards this config defines that hold a model (``holds_model``)."""
        return [
            f"reward.{section}.{name}"
            for section in DEFINING_SECTIONS
            for name, entry in getattr(self, section).items()
            if type(entry).holds_model
        ]

    def names(self) -> set[str]:
        """Every reward the routing table names (the registry's, routed by data_source name, aside)."""
        return {*self.by_data_source.values(), *([self.default] if self.default else [])}


def _find_cycle(start: str, chain: list[str], uses: Mapping[str, list[tuple[str, str]]]) -> None:
    """Raises if a reward reachable from ``chain[-1]`` leads back to ``start``."""
    for where, used in uses.get(chain[-1], []):
        if used == start:
            loop = " -> ".join([*chain, used])
            raise ValueError(f"{where}: {used!r} contains itself ({loop}); a reward may not be its own component")
        if used not in chain:
            _find_cycle(start, [*chain, used], uses)


@dataclass(frozen=True)
class RewardSettings:
    """What a reward may read of the run's config when it is built (``from_settings``)."""

    reward: RewardConfig
    sandbox: SandboxConfig
    built: dict[str, Reward | BatchReward] = field(default_factory=dict, compare=False, repr=False)
    """The rewards built so far under these settings, by name (``build_reward`` fills it): a
    reward named by a route and by a hybrid's component is built once (one model in memory)."""
