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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class FrozenMapping(Mapping[str, Any]):
    """A read-only mapping that pickles: a ``Trajectory`` crosses actors (a rollout replica's
    finished group is scored on a reward worker), and ``types.MappingProxyType`` does not pickle.
    It has no method that changes it, and its dict is a private copy."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FrozenMapping({self._data!r})"

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (FrozenMapping, (self._data,))


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
    extra: Mapping[str, Any] = field(default_factory=FrozenMapping)
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
    """A read-only copy of row data: mappings become ``FrozenMapping``, lists tuples."""
    if isinstance(value, Mapping):
        return FrozenMapping({k: freeze(v) for k, v in value.items()})
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


@dataclass(frozen=True)
class GroupVerdict:
    """A group grader's verdict on one trajectory of its group (GAR, R-6.6)."""

    quality: float = 1.0
    """In (0, 1]: how good a passing answer is among its group's (1: the best kind). GAR
    down-weights a passer's positive advantage by it and hands the mass to the better ones."""
    hacking: bool = False
    """The answer passes the reward by a forbidden route (confirmed reward hacking): GAR scores
    it as a failure (effective reward 0) and recomputes the group's statistics."""


@dataclass(frozen=True)
class GroupInfra:
    """A group grader that could give no verdict (a judge that timed out, a transport error):
    GAR leaves the group's advantages as the estimator made them, and ``gar/infra_groups`` counts it."""

    reason: str


@runtime_checkable
class GroupReward(Protocol):
    """A group grader (GAR, R-6.6): one whole prompt group at once, with the per-sample results
    its routed reward already gave (an ``is_infra`` one included; its verdict is ignored), ->
    one ``GroupVerdict`` per trajectory, in order, or ``GroupInfra`` for the whole group.

    Why a group: quality is relative (the shortest correct answer, the clearest proof), and a
    grader that compares answers needs them side by side. A plain function is one; an
    exception from it is a bug in it and fails the reward phase, like a reward's."""

    def __call__(
        self, trajectories: Sequence[Trajectory], results: Sequence[RewardResult]
    ) -> Sequence[GroupVerdict] | GroupInfra: ...


def check_verdicts(value: object, size: int, where: str) -> list[GroupVerdict] | GroupInfra:
    """A group grader's return value, checked: ``GroupInfra``, or ``size`` verdicts with
    qualities in (0, 1]; anything else is a bug in the grader (``where`` names it)."""
    if isinstance(value, GroupInfra):
        return value
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{where} returned {type(value).__name__} {value!r}; a group grader returns a list of GroupVerdict or a GroupInfra")
    verdicts = list(value)
    if len(verdicts) != size:
        raise ValueError(f"{where} returned {len(verdicts)} verdicts for a group of {size} trajectories")
    for i, verdict in enumerate(verdicts):
        if not isinstance(verdict, GroupVerdict):
            raise TypeError(f"{where} returned {type(verdict).__name__} {verdict!r} at {i}; expected a GroupVerdict")
        if not (math.isfinite(verdict.quality) and 0.0 < verdict.quality <= 1.0):
            raise ValueError(f"{where} returned quality {verdict.quality!r} at {i}; a quality lies in (0, 1]")
    return verdicts


@runtime_checkable
class ModelReward(Protocol):
    """A reward that holds a model on a device (a reward model, a judge's engine): it gives its
    memory back between scorings and takes it again, with the rollout engines' contract
    (``engines/rollout/protocol.py``: ``sleep`` frees the device memory until ``wake_up``).

    A reward colocated with the rollout (``reward.placement: colocate``) shares its GPU: the
    reward worker wakes it before each scoring and puts it to sleep after (R-6.8), and puts it
    to sleep once built. In a pool of its own it stays awake."""

    device: str
    """Where its model is: ``cpu`` or ``cuda``."""

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

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
