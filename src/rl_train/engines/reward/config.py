"""The ``reward:`` config section: which reward scores each data source, and its settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.reward.model_config import RewardModelConfig
from rl_train.engines.reward.registry import REWARDS, check_reward
from rl_train.engines.sandbox import SandboxConfig

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward, Reward


class DefinedReward(Protocol):
    """A reward defined by name in a section of ``reward:`` (a reward model, a judge, a remote
    grader, a hybrid stack): the section's entry builds it (importing its implementation only
    then, in the worker that scores with it)."""

    def build(self, name: str, settings: RewardSettings) -> Reward | BatchReward: ...


DEFINING_SECTIONS: tuple[str, ...] = ("models",)
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


class RewardConfig(StrictModel):
    num_workers: int = Field(1, ge=1)
    """Reward worker actors; samples are spread across them."""
    # The sections that define rewards by name (DEFINING_SECTIONS) go here, above the routes
    # that name them: the routes' validator reads them.
    models: dict[str, RewardModelConfig] = Field(default_factory=dict)
    """Discriminative reward models (HF sequence classifiers) by name, routed like registered rewards: reward.models.my_rm.path=..., reward.by_data_source.arith=my_rm."""
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
        self.defined()
        return self

    def defined(self) -> Mapping[str, DefinedReward]:
        """The rewards the config's sections define, by name."""
        found: dict[str, DefinedReward] = {}
        for section in DEFINING_SECTIONS:
            for name, entry in getattr(self, section).items():
                if name in found:
                    raise ValueError(f"reward.{section}.{name}: the name {name!r} is defined twice in reward:")
                found[name] = entry
        return found

    def names(self) -> set[str]:
        """Every reward the routing table names (the registry's, routed by data_source name, aside)."""
        return {*self.by_data_source.values(), *([self.default] if self.default else [])}


@dataclass(frozen=True)
class RewardSettings:
    """What a reward may read of the run's config when it is built (``from_settings``)."""

    reward: RewardConfig
    sandbox: SandboxConfig
