"""The reward interface (R-6.1): a reward reads one whole trajectory and returns a ``RewardResult``.

Every kind of reward (rules, code run in the sandbox, and later reward models, judges and
remote graders) is a ``Reward``: a callable from a read-only ``Trajectory`` to a result. A
reward that scores many trajectories at once better than one by one (a model's batched
forward, a judge's batched decode, a remote endpoint's batch call) also has ``score_batch``
(``BatchReward``); the reward worker then hands it all the trajectories routed to it.

Infrastructure failures are results, not exceptions: a reward whose grader could not give a
verdict (a sandbox that did not start, a harness that crashed, a transport error) returns
``RewardResult.infra(reason)``; the sample is then retried and, failing again, is left out
of the group statistics and the advantage (R-6.5). An exception from a reward is a bug in it
and fails the reward phase.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a multi-turn trajectory, as the agent loop recorded it."""

    name: str
    error: bool
    """The tool reported an error (its text is in ``Trajectory.transcript``)."""
    seconds: float


@dataclass(frozen=True)
class Message:
    """One part of a response as a chat message: a model turn or what the world said back."""

    role: str
    """``assistant`` (a model turn's graded tokens), ``tool`` (a tool's answer) or ``user`` (a later user message)."""
    content: str
    """The text, without the policy's own markup around an observation (``<tool_response>``...)."""


@dataclass(frozen=True)
class Trajectory:
    """What a reward sees of one trajectory; read-only (``extra`` is frozen too)."""

    prompt: str
    """The prompt text of the row."""
    response: str
    """The answer: the graded tokens (response_mask == 1, R-6.2) up to end of sequence; of a
    multi-turn trajectory, its last turn (what the model wrote after the last tool answer)."""
    graded_text: str
    """Every graded token of the response, all turns, tool answers (mask 0) left out."""
    transcript: str
    """The whole response as decoded, tool answers included (equal to ``graded_text`` for a
    single turn); a reward reads the tools' results here."""
    data_source: str
    ground_truth: str
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The row's other columns (not prompt, data_source, ground_truth), frozen."""
    tool_calls: tuple[ToolCall, ...] = ()
    turns: int = 1
    """Model turns (1 for a single-turn trajectory)."""
    stop_reason: str = ""
    messages: tuple[Message, ...] = ()
    """The response as chat messages, in order: each model turn (end of sequence left out) an
    ``assistant`` message, each observation between turns its own ``tool`` or ``user`` message.
    A reward model re-templates them with its own chat template (R-6.3). Empty where whoever
    built the trajectory did not split it: then ``chat()`` takes the response as one turn."""

    def chat(self) -> list[dict[str, str]]:
        """The prompt as the user's message, then the response's ``messages`` (or the response
        as one assistant message), as the dicts a chat template reads."""
        parts = self.messages or (Message("assistant", self.response),)
        return [{"role": "user", "content": self.prompt}, *({"role": m.role, "content": m.content} for m in parts)]

    @classmethod
    def of_answer(cls, row: Mapping[str, Any], response: str) -> Trajectory:
        """A single-turn trajectory: ``response`` (the decoded answer) to the dataset ``row``."""
        return cls(
            prompt=str(row.get("prompt", "")),
            response=response,
            graded_text=response,
            transcript=response,
            data_source=str(row["data_source"]),
            ground_truth=str(row["ground_truth"]),
            extra=freeze({k: v for k, v in row.items() if k not in ROW_FIELDS}),
            messages=(Message("assistant", response),),
        )


ROW_FIELDS = ("prompt", "data_source", "ground_truth")
"""The dataset row's columns a ``Trajectory`` names; the others are its ``extra``."""


def freeze(value: Any) -> Any:
    """A read-only copy of row data: mappings become ``MappingProxyType``, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class RewardResult:
    """A reward's verdict on one trajectory."""

    score: float
    """The scalar reward (0.0 on an infrastructure failure, where it means nothing)."""
    sub_scores: Mapping[str, float] = field(default_factory=dict)
    """Named components (``tests_passed``, ``answer_found``...), logged per data source. A plain
    dict (results cross from the reward workers to the driver, and a mapping proxy does not
    pickle)."""
    is_infra: bool = False
    """No verdict: the grader's infrastructure failed (R-6.5); the score must be ignored."""
    reason: str = ""
    """Why it is infra (empty otherwise)."""

    @classmethod
    def infra(cls, reason: str, sub_scores: Mapping[str, float] | None = None) -> RewardResult:
        return cls(0.0, dict(sub_scores or {}), True, reason)


@runtime_checkable
class Reward(Protocol):
    """A reward: one trajectory in, one result out. A plain function is one; a function that
    returns a number instead of a ``RewardResult`` is accepted too (``as_result``)."""

    def __call__(self, trajectory: Trajectory) -> RewardResult: ...


@runtime_checkable
class BatchReward(Protocol):
    """A reward that scores a batch at once (model-based and remote rewards): one result per
    trajectory, in order."""

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]: ...


def as_result(value: object, where: str) -> RewardResult:
    """A reward's return value as a ``RewardResult``: a number is a score; anything else, or a
    score that is not finite, is a bug in the reward (``where`` names it)."""
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, int | float):  # bool included: True is a pass
        result = RewardResult(float(value))
    else:
        raise TypeError(f"{where} returned {type(value).__name__} {value!r}; a reward returns a number or a RewardResult")
    if not math.isfinite(result.score) or not all(math.isfinite(v) for v in result.sub_scores.values()):
        raise ValueError(f"{where} returned a score that is not finite: {result}")
    return result


def score_all(reward: Reward | BatchReward, trajectories: Sequence[Trajectory], where: str) -> list[RewardResult]:
    """``reward``'s results on ``trajectories``: one batch call where it has ``score_batch``."""
    if isinstance(reward, BatchReward):
        results = list(reward.score_batch(trajectories))
        if len(results) != len(trajectories):
            raise ValueError(f"{where}.score_batch returned {len(results)} results for {len(trajectories)} trajectories")
        return [as_result(r, where) for r in results]
    return [as_result(reward(t), where) for t in trajectories]
