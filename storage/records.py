"""Between TransferQueue records and padded tensors.

A trajectory record holds ``prompt_ids`` and ``response_ids`` (lists of ints) and per-token
fields over the response only (``rollout_log_probs``, ``old_log_probs``, ``advantages``...).
Training wants right-padded ``[B, T]`` tensors over the whole sequence, with the per-token
fields placed on the response positions; ``scatter_response`` goes back.
"""

from __future__ import annotations

from typing import Any

import torch


def collate(
    records: list[dict[str, Any]], pad_token_id: int, token_fields: list[str] = ()
) -> dict[str, torch.Tensor]:  # type: ignore[assignment]
    """Right-padded ``input_ids``, ``attention_mask``, ``response_mask`` and ``token_fields``."""
    lengths = [len(r["prompt_ids"]) + len(r["response_ids"]) for r in records]
    width = max(lengths, default=1)
    batch_size = len(records)
    input_ids = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch_size, width), dtype=torch.long)
    response_mask = torch.zeros((batch_size, width), dtype=torch.float32)
    extra = {name: torch.zeros((batch_size, width), dtype=torch.float32) for name in token_fields}
    for i, record in enumerate(records):
        prompt_len, response_len = len(record["prompt_ids"]), len(record["response_ids"])
        ids = list(record["prompt_ids"]) + list(record["response_ids"])
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
        graded = record.get("response_mask", [1] * response_len)
        response_mask[i, prompt_len : prompt_len + response_len] = torch.as_tensor(
            graded, dtype=torch.float32
        )
        for name, tensor in extra.items():
            tensor[i, prompt_len : prompt_len + response_len] = torch.as_tensor(
                record[name], dtype=torch.float32
            )
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask, **extra}


def scatter_response(values: torch.Tensor, records: list[dict[str, Any]]) -> list[list[float]]:
    """The response part of each row of a ``[B, T]`` tensor, as lists."""
    out = []
    for i, record in enumerate(records):
        start = len(record["prompt_ids"])
        out.append(values[i, start : start + len(record["response_ids"])].tolist())
    return out
