"""The run's TransferQueue actor as a ``QueueStore`` (``storage/handles.py``).

The replay buffers and the group filter read and write records through this, the same calls a
unit test makes on a plain ``TransferQueue``; each method is one actor call, awaited.
"""

from __future__ import annotations

from typing import Any

import ray

from rl_train.engines.workers.pending import Actor


class QueueClient:
    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def put(
        self, partition: str, records: dict[str, dict[str, Any]], tags: dict[str, dict[str, Any]] | None = None
    ) -> int:
        return int(ray.get(self.actor.put.remote(partition, records, tags)))

    def get(
        self,
        partition: str,
        keys: list[str],
        field_names: list[str] | None = None,
        optional_fields: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        return list(ray.get(self.actor.get.remote(partition, keys, field_names, optional_fields)))

    def delete(self, partition: str, keys: list[str]) -> int:
        return int(ray.get(self.actor.delete.remote(partition, keys)))

    def get_tags(self, partition: str, keys: list[str]) -> list[dict[str, Any]]:
        return list(ray.get(self.actor.get_tags.remote(partition, keys)))

    def set_tags(self, partition: str, tags: dict[str, dict[str, Any]]) -> None:
        ray.get(self.actor.set_tags.remote(partition, tags))

    def query(self, partition: str, **match: Any) -> list[str]:
        return list(ray.get(self.actor.query.remote(partition, **match)))

    def put_batch(self, batch_id: str, partition: str, keys: list[str], **meta: Any) -> None:
        ray.get(self.actor.put_batch.remote(batch_id, partition, keys, **meta))

    def get_batch(self, batch_id: str, fields: list[str] | None = None) -> dict[str, Any]:
        return dict(ray.get(self.actor.get_batch.remote(batch_id, fields)))

    def drop_batch(self, batch_id: str) -> None:
        ray.get(self.actor.drop_batch.remote(batch_id))
