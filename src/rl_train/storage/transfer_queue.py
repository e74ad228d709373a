"""The TransferQueue (R-9.1): keyed records in partitions, with fields and tags.

Rollout writes variable-length trajectories here; training reads batches from here; Prefect
tasks pass only keys and batch ids. It runs as one Ray actor per run (``TransferQueueActor``)
and is plain Python underneath, so it is unit-testable without Ray.

Prompt records move pending -> running -> finished | failure (a failed prompt may be
re-dispatched: failure -> pending); any other transition is a bug and raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PARTITIONS = ("train", "val")
PROMPT_TRANSITIONS: dict[str | None, set[str]] = {
    None: {"pending"},
    "pending": {"running", "pending"},
    "running": {"finished", "failure", "pending"},
    "failure": {"pending"},
    "finished": set(),
}


class TagTransitionError(ValueError):
    """A prompt's status moved along an edge the lifecycle does not have."""


class TransferQueue:
    def __init__(self, partitions: Iterable[str] = PARTITIONS) -> None:
        self._fields: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in partitions}
        self._tags: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in partitions}
        self._batches: dict[str, dict[str, Any]] = {}

    def _partition(self, name: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        if name not in self._fields:
            raise KeyError(f"unknown TransferQueue partition {name!r}; available: {', '.join(self._fields)}")
        return self._fields[name], self._tags[name]

    # -- records ------------------------------------------------------------------------
    def put(
        self,
        partition: str,
        records: dict[str, dict[str, Any]],
        tags: dict[str, dict[str, Any]] | None = None,
    ) -> int:
        """Insert or update records (fields are merged into existing ones)."""
        fields, all_tags = self._partition(partition)
        for key, record in records.items():
            fields.setdefault(key, {}).update(record)
            all_tags.setdefault(key, {})
        for key, record_tags in (tags or {}).items():
            self._set_tags(partition, key, record_tags)
        return len(records)

    def update(
        self, partition: str, records: dict[str, dict[str, Any]], tags: dict[str, dict[str, Any]] | None = None
    ) -> list[str]:
        """Merge fields (and tags) into the records of these keys that exist; the others are left
        out, never created. Returns the record keys updated. A late writer uses this: a group's
        scores computed in the background land on its records only if the group was not evicted
        meanwhile (``put`` would leave orphan records behind)."""
        fields, all_tags = self._partition(partition)
        present = [key for key in records if key in fields]
        for key in present:
            fields[key].update(records[key])
        for key, record_tags in (tags or {}).items():
            if key in all_tags:
                self._set_tags(partition, key, record_tags)
        return present

    def get(
        self,
        partition: str,
        keys: list[str],
        field_names: list[str] | None = None,
        optional_fields: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Records of ``keys`` in order; only ``field_names`` when given (a missing one raises),
        plus those of ``optional_fields`` that a record has. Choosing fields keeps what crosses
        to the caller (an actor call's reply) to what it reads."""
        fields, _ = self._partition(partition)
        out = []
        for key in keys:
            record = fields.get(key)
            if record is None:
                raise KeyError(f"TransferQueue partition {partition!r} has no record {key!r}")
            if field_names is None and optional_fields is None:
                out.append(dict(record))
                continue
            required = field_names or []
            missing = [f for f in required if f not in record]
            if missing:
                raise KeyError(
                    f"record {key!r} in {partition!r} lacks field(s) {missing}; it has {sorted(record)}"
                )
            chosen = {f: record[f] for f in required}
            chosen.update((f, record[f]) for f in optional_fields or [] if f in record)
            out.append(chosen)
        return out

    def delete(self, partition: str, keys: Iterable[str]) -> int:
        fields, tags = self._partition(partition)
        removed = 0
        for key in keys:
            removed += fields.pop(key, None) is not None
            tags.pop(key, None)
        return removed

    # -- tags ---------------------------------------------------------------------------
    def _set_tags(self, partition: str, key: str, new_tags: dict[str, Any]) -> None:
        _, tags = self._partition(partition)
        current = tags.setdefault(key, {})
        if current.get("kind", new_tags.get("kind")) == "prompt" and "status" in new_tags:
            old, new = current.get("status"), new_tags["status"]
            if new not in PROMPT_TRANSITIONS.get(old, set()):
                raise TagTransitionError(f"prompt {key!r}: status cannot go from {old!r} to {new!r}")
        current.update(new_tags)

    def set_tags(self, partition: str, tags: dict[str, dict[str, Any]]) -> None:
        for key, record_tags in tags.items():
            if key not in self._tags[partition]:
                raise KeyError(f"TransferQueue partition {partition!r} has no record {key!r}")
            self._set_tags(partition, key, record_tags)

    def get_tags(self, partition: str, keys: list[str]) -> list[dict[str, Any]]:
        _, tags = self._partition(partition)
        return [dict(tags[key]) for key in keys]

    def query(self, partition: str, **match: Any) -> list[str]:
        """Keys whose tags equal every ``match`` item, in insertion order."""
        _, tags = self._partition(partition)
        return [key for key, t in tags.items() if all(t.get(k) == v for k, v in match.items())]

    def count(self, partition: str, **match: Any) -> int:
        return len(self.query(partition, **match))

    # -- batches: what Prefect tasks pass around instead of tensors ---------------------
    def put_batch(self, batch_id: str, partition: str, keys: list[str], **meta: Any) -> None:
        self._batches[batch_id] = {"partition": partition, "keys": list(keys), **meta}

    def get_batch(self, batch_id: str, fields: list[str] | None = None) -> dict[str, Any]:
        """The batch's keys and metadata; only ``fields`` of it when given (what crosses to the
        caller is then only what it reads)."""
        if batch_id not in self._batches:
            raise KeyError(f"unknown batch {batch_id!r}")
        batch = self._batches[batch_id]
        return dict(batch) if fields is None else {name: batch[name] for name in fields}

    def update_batch(self, batch_id: str, **meta: Any) -> None:
        self.get_batch(batch_id)
        self._batches[batch_id].update(meta)

    def drop_batch(self, batch_id: str, delete_records: bool = True) -> None:
        batch = self._batches.pop(batch_id, None)
        if batch and delete_records:
            self.delete(batch["partition"], batch["keys"])

    # -- checkpoint: the records and tags of some partitions, and back -----------
    def export_records(self, partitions: Iterable[str]) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
        """``(partition, key, fields, tags)`` of every record in ``partitions``, insertion order.

        Batches are not exported: a checkpoint is taken between global steps, when every
        batch has been trained and released."""
        rows = []
        for partition in partitions:
            fields, tags = self._partition(partition)
            rows += [(partition, key, dict(record), dict(tags[key])) for key, record in fields.items()]
        return rows

    def import_records(self, rows: Iterable[tuple[str, str, dict[str, Any], dict[str, Any]]]) -> int:
        """Put exported rows back as they were (tags included, no lifecycle check: they were
        valid when exported). A partition must be empty before its rows come back."""
        rows = list(rows)
        for partition in {r[0] for r in rows}:
            fields, _ = self._partition(partition)
            if fields:
                raise ValueError(
                    f"TransferQueue partition {partition!r} already holds {len(fields)} records; "
                    "a checkpoint is restored into an empty queue"
                )
        for partition, key, record, record_tags in rows:
            fields, tags = self._partition(partition)
            fields[key] = dict(record)
            tags[key] = dict(record_tags)
        return len(rows)

    def stats(self) -> dict[str, int]:
        return {f"tq/{p}_records": len(f) for p, f in self._fields.items()} | {
            "tq/batches": len(self._batches)
        }
