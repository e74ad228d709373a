"""The TransferQueue's records and tags as one Arrow table, and back (R-9.1, R-9.2).

One row per record: ``partition``, ``key``, ``tags`` (JSON: small, mixed-type dicts), and one
column per field name. A field column is typed by Arrow (``list<int64>`` token ids,
``list<double>`` log-probs, strings, numbers), so a checkpoint is a plain Parquet table any
tool reads; a null in it means the record has no such field. A column Arrow cannot type
exactly (mixed types, or a field whose value is ``None``) is stored as JSON text under
``json:<name>`` instead. Either way the round trip is exact: Python floats are IEEE doubles
in both, and every column is checked against its values, type for type, before it is used.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

FIELD_PREFIX = "field:"
JSON_PREFIX = "json:"
_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types, recursively (``1 == 1.0`` is not good enough here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:  # NaN
        return b != b
    return bool(a == b)


def _typed_column(values: list[Any]) -> pa.Array | None:
    """An Arrow column of ``values`` (``_ABSENT`` -> null) if it reads back exactly, else None."""
    if any(v is None for v in values):
        return None
    plain = [None if v is _ABSENT else v for v in values]
    try:
        column = pa.array(plain)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return None
    back = column.to_pylist()
    ok = all(v is _ABSENT and b is None or _same(v, b) for v, b in zip(values, back, strict=True))
    return column if ok else None


def records_to_table(rows: list[tuple[str, str, dict[str, Any], dict[str, Any]]]) -> pa.Table:
    """``(partition, key, fields, tags)`` rows -> one table (see the module docstring)."""
    names = sorted({name for _, _, fields, _ in rows for name in fields})
    columns: dict[str, pa.Array] = {
        "partition": pa.array([r[0] for r in rows], pa.string()),
        "key": pa.array([r[1] for r in rows], pa.string()),
        "tags": pa.array([json.dumps(r[3], sort_keys=True) for r in rows], pa.string()),
    }
    for name in names:
        values = [fields.get(name, _ABSENT) for _, _, fields, _ in rows]
        column = _typed_column(values)
        if column is not None:
            columns[FIELD_PREFIX + name] = column
        else:
            columns[JSON_PREFIX + name] = pa.array(
                [None if v is _ABSENT else json.dumps(v) for v in values], pa.string()
            )
    return pa.table(columns)


def table_to_records(table: pa.Table) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """The rows ``records_to_table`` wrote, fields and tags exactly as they were."""
    data = table.to_pydict()
    rows = []
    for i, (partition, key, tags) in enumerate(zip(data["partition"], data["key"], data["tags"], strict=True)):
        fields: dict[str, Any] = {}
        for column, values in data.items():
            value = values[i]
            if value is None:
                continue
            if column.startswith(FIELD_PREFIX):
                fields[column[len(FIELD_PREFIX) :]] = value
            elif column.startswith(JSON_PREFIX):
                fields[column[len(JSON_PREFIX) :]] = json.loads(value)
        rows.append((partition, key, fields, json.loads(tags)))
    return rows


def requeue_in_flight(
    rows: list[tuple[str, str, dict[str, Any], dict[str, Any]]], version: int
) -> tuple[list[tuple[str, str, dict[str, Any], dict[str, Any]]], list[str]]:
    """Resume policy (R-9.3) over exported rows: a prompt that was pending, running or failed
    goes back to ``pending`` with no partial output, as if just dispatched under ``version``
    (the weights served after the resume); its trajectories are dropped. Finished groups stay
    as they are. Returns (the rows to import, the re-queued prompt keys in their order)."""
    requeued = {
        key
        for _, key, _, tags in rows
        if tags.get("kind") == "prompt" and tags.get("status") in ("pending", "running", "failure")
    }
    kept, order = [], []
    for partition, key, fields, tags in rows:
        if tags.get("kind") == "trajectory" and tags.get("group_id") in requeued:
            continue
        if key in requeued:
            tags = {**tags, "status": "pending", "partial": False, "version": version}
            order.append(key)
        kept.append((partition, key, fields, tags))
    return kept, order
