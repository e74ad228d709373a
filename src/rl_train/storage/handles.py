"""What the replay buffers and the group filter use of the queue, the replicas and the reward pool.

Each is a small Protocol with two kinds of implementation: the plain in-process objects that the
unit tests drive the buffers with (``TransferQueue``, a scripted replica), and the typed clients
around the run's Ray actors (``engines/workers``: ``QueueClient``, ``RolloutClient``,
``RewardClient``). Nothing here imports Ray: a call in flight is a ``Pending``, whatever runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """A call started and not yet waited for: ``wait`` returns its result or raises its error."""

    def wait(self) -> T_co: ...


@dataclass(frozen=True)
class Done(Generic[T]):
    """The ``Pending`` of an in-process call, which ran to its end when it was started."""

    value: T

    def wait(self) -> T:
        return self.value


class QueueStore(Protocol):
    """The TransferQueue's records, tags and batches, as the replay buffers read and write them."""

    def put(
        self, partition: str, records: dict[str, dict[str, Any]], tags: dict[str, dict[str, Any]] | None = None
    ) -> int: ...

    def get(
        self,
        partition: str,
        keys: list[str],
        field_names: list[str] | None = None,
        optional_fields: list[str] | None = None,
    ) -> list[dict[str, Any]]: ...

    def delete(self, partition: str, keys: list[str]) -> int: ...

    def get_tags(self, partition: str, keys: list[str]) -> list[dict[str, Any]]: ...

    def set_tags(self, partition: str, tags: dict[str, dict[str, Any]]) -> None: ...

    def query(self, partition: str, **match: Any) -> list[str]: ...

    def put_batch(self, batch_id: str, partition: str, keys: list[str], **meta: Any) -> None: ...

    def get_batch(self, batch_id: str, fields: list[str] | None = None) -> dict[str, Any]: ...

    def drop_batch(self, batch_id: str) -> None: ...


class GeneratingReplica(Protocol):
    """A rollout replica as the sync buffer drives it: a round of prompts at a time."""

    def start_generating(
        self, partition: str, keys: list[str], n: int, params: dict[str, Any]
    ) -> Pending[list[str]]:
        """Generate ``n`` trajectories for each prompt of ``keys``; ``wait`` gives their keys.
        An in-process replica may raise here already."""
        ...


class QueueingReplica(Protocol):
    """A rollout replica as the async buffer drives it: prompts queued for background generation."""

    def enqueue(self, partition: str, keys: list[str], n: int, params: dict[str, Any]) -> None:
        """Queue the prompts and return at once (a Ray actor keeps this caller's order)."""
        ...


class RewardScorer(Protocol):
    """A reward worker: scores trajectories and writes each ``reward`` (and ``is_infra``) onto
    its record; the buffers read those back, not what it returns."""

    def score(self, partition: str, keys: list[str]) -> Sequence[object]: ...


class StreamingScorer(RewardScorer, Protocol):
    """A reward worker that scores in the background (``reward.streaming``): ``submit`` queues
    prompt groups and returns at once; each group's scores land on its records with the
    ``scored`` tag on its prompt. A group already queued there, or already scored, is ignored,
    so handing a group again (after a worker died and lost its queue) is safe."""

    def submit(self, partition: str, groups: list[str], n: int) -> None: ...
