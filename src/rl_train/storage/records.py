"""Between TransferQueue records and padded tensors.

A trajectory record holds ``prompt_ids`` and ``response_ids`` (lists of ints) and per-token
fields over the response only (``rollout_log_probs``, ``old_log_probs``, ``advantages``...).
Training wants right-padded ``[B, T]`` tensors over the whole sequence, with the per-token
fields placed on the response positions; ``scatter_response`` goes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def collate(
    records: list[dict[str, Any]], pad_token_id: int, token_fields: Sequence[str] = ()
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``response_mask`` and ``token_fields``.

    Rows are padded as Python lists and turned into tensors once per field: per-row tensor
    writes cost more than the model's forward on batches of short sequences.
    """
    prompt_lens = [len(r["prompt_ids"]) for r in records]
    response_lens = [len(r["response_ids"]) for r in records]
    width = max((p + n for p, n in zip(prompt_lens, response_lens, strict=True)), default=1)

    def rows(values: Sequence[Sequence[float]], pad: float, prefix: list[int]) -> list[list[float]]:
        out: list[list[float]] = []
        for row, lead in zip(values, prefix, strict=True):
            full = [pad] * lead + list(row)
            out.append(full + [pad] * (width - len(full)))
        return out

    zeros = [0] * len(records)
    ids = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in records]
    graded = [r.get("response_mask") or [1] * n for r, n in zip(records, response_lens, strict=True)]
    batch = {
        "input_ids": torch.tensor(rows(ids, pad_token_id, zeros), dtype=torch.long),
        "attention_mask": torch.tensor(rows([[1] * len(x) for x in ids], 0, zeros), dtype=torch.long),
        "response_mask": torch.tensor(rows(graded, 0.0, prompt_lens), dtype=torch.float32),
    }
    for name in token_fields:
        batch[name] = torch.tensor(rows([r[name] for r in records], 0.0, prompt_lens), dtype=torch.float32)
    return batch


def scatter_response(values: torch.Tensor, records: list[dict[str, Any]]) -> list[list[float]]:
    """The response part of each row of a ``[B, T]`` tensor, as lists (the tensor turned into
    lists once: a ``tolist`` per row cost 9-15 ms at 1,024 rows, this 1.2 ms)."""
    out = []
    for row, record in zip(values.tolist(), records, strict=False):  # rows past the records: padding
        start = len(record["prompt_ids"])
        out.append(row[start : start + len(record["response_ids"])])
    return out
