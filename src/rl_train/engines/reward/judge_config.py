"""The ``reward.judges`` section: generative judges defined by name (``judge.py`` scores with them).

Kept apart from ``judge.py`` so that loading a config imports no torch: an entry's ``build``
imports the judge, in the worker that scores with it.
"""

from __future__ import annotations

import re
import string
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rl_train.algorithms.config import StrictModel
from rl_train.engines.rollout.registry import RolloutEngineName

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward
    from rl_train.engines.reward.config import RewardSettings

TEMPLATE_FIELDS = ("prompt", "response", "ground_truth", "transcript")
"""The placeholders a judge's template may use: the row's prompt, the answer graded (the last
turn of a multi-turn trajectory), the row's ground truth, and the whole response with the
tools' answers."""

DEFAULT_TEMPLATE = (
    "You are grading an answer to a question.\n"
    "Question: {prompt}\n"
    "Reference answer: {ground_truth}\n"
    "Answer to grade: {response}\n"
    "Rate the answer from 0 (wrong) to 10 (right and complete). Reply with the number only.\n"
    "Score: "
)
"""The default judge prompt; its verdict is read by the default parser (a number, 0 to 10)."""

DEFAULT_NUMBER_PATTERN = r"(-?\d+(?:\.\d+)?)"
"""The first number of the verdict."""


class VerdictParserConfig(StrictModel):
    kind: Literal["number", "words"] = "number"
    """number: the first match of pattern, its first group a number on the scale; words: the verdict's first word (case-insensitive, whole words) that words names."""
    pattern: str = DEFAULT_NUMBER_PATTERN
    """number: a regular expression searched in the verdict; its first group is the number (the default: the verdict's first number)."""
    scale: tuple[float, float] = (0.0, 10.0)
    """number: the verdict's range [low, high], mapped linearly onto the score 0..1 ((n - low) / (high - low)); a number outside it is unparseable."""
    words: dict[str, float] = Field(default_factory=dict)
    """words: verdict word -> score, e.g. {yes: 1.0, no: 0.0}; the earliest of them in the verdict wins."""

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as error:
            raise ValueError(f"got {value!r}: not a regular expression ({error})") from None
        if compiled.groups < 1:
            raise ValueError(f"got {value!r}: the pattern needs a group, e.g. '(\\d+)', whose text is the number")
        return value

    @model_validator(mode="after")
    def _usable(self) -> VerdictParserConfig:
        low, high = self.scale
        if not high > low:
            raise ValueError(f"scale: got {list(self.scale)}: high must be above low")
        if self.kind == "words" and not self.words:
            raise ValueError("words: a words parser needs at least one word, e.g. {yes: 1.0, no: 0.0}")
        for word in self.words:
            if not word.strip() or word != word.strip():
                raise ValueError(f"words: got {word!r}: a word is non-empty text without blanks around it")
        return self


class JudgeConfig(StrictModel):
    holds_model: ClassVar[bool] = True
    """Its judge decodes with a model of its own (placement, R-2.6)."""
    model_path: str
    """The judge model (HF format); the policy's own model.path may serve (its weights as loaded, never the trained ones)."""
    engine: RolloutEngineName = "torch"
    """The rollout engine the judge decodes with, its own instance (a registered rollout engine)."""
    template: str = DEFAULT_TEMPLATE
    """The judge's prompt, with placeholders {prompt}, {response}, {ground_truth}, {transcript} (literal braces doubled); the default asks for a score from 0 to 10 after 'Score: '. The text is encoded as a rollout prompt (BOS, then the text): write a chat model's own markup into it."""
    parser: VerdictParserConfig = Field(default_factory=VerdictParserConfig)
    """How a verdict becomes a score; one that cannot be read is sampled once more, then is_infra."""
    max_new_tokens: int = Field(16, ge=1)
    """Tokens of a verdict."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of the verdict (0: greedy, the same verdict for the same text)."""
    retry_temperature: float = Field(1.0, gt=0)
    """Temperature of the one retry of an unparseable verdict: a fresh sample (a greedy retry would repeat it)."""
    timeout_s: float = Field(60.0, gt=0)
    """Limit of one decode call (the batch's, then its retry's), seconds; past it the call is aborted and its samples are is_infra."""
    device: str = "cpu"
    """Where the judge's engine runs (cpu, cuda, cuda:1...)."""
    seed: int = 0
    """Seed of the judge's own sampling stream."""

    @field_validator("template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            names = [field for _, field, _, _ in string.Formatter().parse(value) if field is not None]
        except ValueError as error:
            raise ValueError(f"not a template ({error}); write literal braces as '{{{{' and '}}}}'") from None
        unknown = sorted({n for n in names if n not in TEMPLATE_FIELDS})
        if unknown:
            raise ValueError(f"unknown placeholders {unknown}; allowed: {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}")
        if not names:
            raise ValueError("no placeholder: the judge would see the same text for every answer; use {response} at least")
        return value

    def build(self, name: str, settings: RewardSettings) -> BatchReward:
        """The judge, its engine loaded now (in the worker that scores with it)."""
        from rl_train.engines.reward.judge import GenerativeJudge

        return GenerativeJudge.load(name, self)
