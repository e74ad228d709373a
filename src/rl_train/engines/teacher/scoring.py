"""A teacher's scores of finished trajectories: per response token, the log-prob of the sampled
token and, with ``top_k``, its k most likely next tokens (R-4.10).

The fields are those of ``algorithms/teacher_fields.py``, aligned with the response: entry t
scores response token t under the teacher's distribution given everything before it (prompt,
earlier response tokens, tool observations alike), exactly as the student's log-probs are laid
out. Each scored record also keeps the ``token_versions`` it was scored at
(``TEACHER_SCORED_VERSIONS``): a trajectory that a later policy version went on with (a partial
rollout resumed) no longer matches them and is scored again, so a teacher's scores of one
version's prefix never stand for another's tokens (``needs_scoring``).

A trajectory the teacher cannot read (longer than its positions) is not scored: it gets
``is_infra`` with the reason, and zeros in the teacher fields so that it collates; the
advantage phase then gives it no gradient, as for a reward that failed (R-6.5). A forward pass
that fails on a micro-batch is retried one trajectory at a time, and only those that fail alone
are infra.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from rl_train.algorithms.teacher_fields import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS
from rl_train.engines.teacher.config import TEACHER_SCORED_VERSIONS

logger = logging.getLogger(__name__)

INFRA_PREFIX = "teacher: "

Record = dict[str, Any]
__all__ = ["TEACHER_SCORED_VERSIONS", "infra_fields", "needs_scoring", "score_records"]


def needs_scoring(record: Record, top_k: int) -> bool:
    """Whether ``record`` lacks the teacher's scores of its current tokens."""
    length = len(record["response_ids"])
    scores = record.get(TEACHER_LOG_PROBS)
    if scores is None or len(scores) != length:
        return True
    if top_k and len(record.get(TEACHER_TOPK_IDS) or ()) != length:
        return True
    return list(record.get(TEACHER_SCORED_VERSIONS) or []) != list(record.get("token_versions") or [])


def _forward(model: Any, records: Sequence[Record], pad_id: int, temperature: float) -> torch.Tensor:
    """[B, T - 1, V] next-token log-probs of right-padded ``prompt + response`` rows."""
    rows = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in records]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], dtype=torch.long)
    positions = torch.arange(width).expand(len(rows), width)
    # right padding under the causal mask alone: no real token sees a padding one
    logits = model(input_ids=ids, attention_mask=None, position_ids=positions).logits
    return torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)


def _fields(log_probs: torch.Tensor, record: Record, top_k: int) -> Record:
    """One row's teacher fields from its [T - 1, V] next-token log-probs."""
    start, length = len(record["prompt_ids"]), len(record["response_ids"])
    rows = log_probs[start - 1 : start - 1 + length]  # row t - 1 predicts token t
    targets = torch.tensor(list(record["response_ids"]), dtype=torch.long)
    out: Record = {
        TEACHER_LOG_PROBS: rows.gather(-1, targets[:, None]).squeeze(-1).tolist(),
        TEACHER_SCORED_VERSIONS: list(record.get("token_versions") or []),
    }
    if top_k:
        values, ids = rows.topk(min(top_k, rows.shape[-1]), dim=-1)
        out[TEACHER_TOPK_IDS] = ids.tolist()
        out[TEACHER_TOPK_LOG_PROBS] = values.tolist()
    return out


def infra_fields(record: Record, top_k: int, reason: str) -> Record:
    """What a trajectory the teacher could not score gets: the flag, the reason, zeros."""
    length = len(record["response_ids"])
    out: Record = {
        TEACHER_LOG_PROBS: [0.0] * length,
        TEACHER_SCORED_VERSIONS: list(record.get("token_versions") or []),
        "is_infra": True,
        "infra_reason": INFRA_PREFIX + reason,
    }
    if top_k:
        out[TEACHER_TOPK_IDS] = [[0] * top_k for _ in range(length)]
        out[TEACHER_TOPK_LOG_PROBS] = [[0.0] * top_k for _ in range(length)]
    return out


@torch.no_grad()
def score_records(
    model: Any,
    records: Sequence[Record],
    *,
    pad_id: int,
    temperature: float,
    top_k: int,
    max_positions: int,
    micro_batch_size: int,
) -> list[Record]:
    """The teacher fields of each record (its ``prompt_ids`` and ``response_ids``), in order."""
    out: list[Record | None] = [None] * len(records)
    readable = []
    for i, record in enumerate(records):
        total = len(record["prompt_ids"]) + len(record["response_ids"])
        if not record["prompt_ids"]:
            out[i] = infra_fields(record, top_k, "an empty prompt gives the first token no context")
        elif total > max_positions:
            out[i] = infra_fields(record, top_k, f"{total} tokens, past the teacher's {max_positions} positions")
        elif not record["response_ids"]:
            out[i] = {TEACHER_LOG_PROBS: [], TEACHER_SCORED_VERSIONS: [], **({TEACHER_TOPK_IDS: [], TEACHER_TOPK_LOG_PROBS: []} if top_k else {})}
        else:
            readable.append(i)
    readable.sort(key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["response_ids"]))  # little padding
    for begin in range(0, len(readable), micro_batch_size):
        chunk = readable[begin : begin + micro_batch_size]
        for i, fields in zip(chunk, _score_chunk(model, [records[i] for i in chunk], pad_id, temperature, top_k), strict=True):
            out[i] = fields
    return [fields for fields in out if fields is not None]


def _score_chunk(model: Any, records: list[Record], pad_id: int, temperature: float, top_k: int) -> list[Record]:
    """A micro-batch's fields; on a failed pass, each record alone (those failing alone: infra)."""
    try:
        log_probs = _forward(model, records, pad_id, temperature)
        return [_fields(row, record, top_k) for row, record in zip(log_probs, records, strict=True)]
    except (RuntimeError, ValueError, IndexError) as error:
        if len(records) == 1:
            logger.warning("teacher: a trajectory could not be scored: %s", error)
            return [infra_fields(records[0], top_k, f"{type(error).__name__}: {error}")]
    return [fields for record in records for fields in _score_chunk(model, [record], pad_id, temperature, top_k)]
