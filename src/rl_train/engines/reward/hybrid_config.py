"""``reward.hybrid.<name>``: a reward that combines other rewards by a declared formula (R-6.7).

A hybrid stack is declared once per name and routed by ``reward.by_data_source`` like any
reward, so each data source gets its own formula::

    reward:
      hybrid:
        checked_rm:
          components: {rule: math, rm: my_rm}     # component -> any reward name
          weights: {rule: 1.0, rm: 0.5}           # unlisted components weigh 1.0
          gates: [{component: rm, requires: rule, at_least: 1.0}]
          clip: [0.0, 1.5]
      by_data_source: {gsm8k: checked_rm}

The score is ``clip(sum(weights[c] * value[c]))``, where ``value[c]`` is component ``c``'s
score when all its gates are open and 0.0 when one is closed; a gate is open when the
component it ``requires`` scored at least ``at_least``. A gated-off component is not scored at
all (the point of a gate: an expensive grader runs only on answers a cheap rule passed). Each
``value[c]`` is a sub-score named ``c`` (so the score can be rebuilt from the sub-scores), and
each of the component's own sub-scores is ``c.<sub>``. A component whose grader failed
(``is_infra``) makes the whole result infra. The names are checked at config load
(``references``): a reward this config defines, a registered one or an import path, and
never the hybrid itself, directly or through another hybrid.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import Field, model_validator

from rl_train.algorithms.config import StrictModel

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward, Reward
    from rl_train.engines.reward.config import RewardSettings

Finite = Annotated[float, Field(allow_inf_nan=False)]
COMPONENT_NAME = re.compile(r"[A-Za-z0-9_-]+")
"""A component's name: it becomes a sub-score and a metric key (``reward/<source>/<component>``),
where a '.' would read as a nested sub-score and a '/' as another level."""


class GateConfig(StrictModel):
    """Component ``component`` counts only if component ``requires`` scored at least ``at_least``."""

    component: str
    """The gated component (a key of the hybrid's components)."""
    requires: str
    """The component whose score opens the gate (another key of the hybrid's components); it is always scored."""
    at_least: Finite = 1.0
    """The gate is open when the required component's score is at least this (1.0: the rule passed)."""


class HybridConfig(StrictModel):
    """One hybrid stack: its components, their weights and gates, and a clip of the sum."""
    holds_model: ClassVar[bool] = False
    """Its components are placed as themselves."""

    components: dict[str, str] = Field(min_length=1)
    """Component name -> the reward that scores it (registered, defined in this reward: section, or an import path); each is logged as reward/<data_source>/<component>."""
    weights: dict[str, Finite] = Field(default_factory=dict)
    """Component name -> its weight in the sum (components not listed weigh 1.0; a weight of 0 logs a component without counting it)."""
    gates: list[GateConfig] = Field(default_factory=list)
    """Conditions for a component to count: [{component: rm, requires: rule, at_least: 1.0}]; a component gated off counts 0.0 and is not scored."""
    clip: tuple[Finite, Finite] | None = None
    """[low, high]: the weighted sum is clipped into this range (None: not clipped)."""

    @model_validator(mode="after")
    def _consistent(self) -> HybridConfig:
        known = ", ".join(self.components)
        for name in self.components:
            if not COMPONENT_NAME.fullmatch(name):
                raise ValueError(f"components: got the name {name!r}; a component's name is letters, digits, '_' and '-'")
        for name in self.weights:
            if name not in self.components:
                raise ValueError(f"weights.{name}: not a component; the components are: {known}")
        for index, gate in enumerate(self.gates):
            for role in ("component", "requires"):
                if getattr(gate, role) not in self.components:
                    raise ValueError(f"gates.{index}.{role}: got {getattr(gate, role)!r}: not a component; the components are: {known}")
            if gate.component == gate.requires:
                raise ValueError(f"gates.{index}: component {gate.component!r} cannot gate itself")
            if gate.requires in self.gated():
                raise ValueError(
                    f"gates.{index}.requires: got {gate.requires!r}, which is gated itself; a gate reads a "
                    "component that is always scored"
                )
        if self.clip is not None and self.clip[0] > self.clip[1]:
            raise ValueError(f"clip: got {list(self.clip)}: low must not exceed high")
        return self

    def gated(self) -> set[str]:
        """The components that have a gate."""
        return {gate.component for gate in self.gates}

    def weight(self, component: str) -> float:
        return self.weights.get(component, 1.0)

    def references(self) -> Mapping[str, str]:
        """Dotted path below this entry -> the reward it names (checked at config load)."""
        return {f"components.{component}": name for component, name in self.components.items()}

    def build(self, name: str, settings: RewardSettings) -> Reward | BatchReward:
        from rl_train.engines.reward.hybrid import HybridReward

        return HybridReward.from_config(name, self, settings)
