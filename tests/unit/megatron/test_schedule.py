"""The schedule helpers in-process: right padding is checked, micro-batches are consecutive
rows. (The schedules themselves against HF: ``test_megatron_cpu.py``.)"""

from __future__ import annotations

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import pytest
import torch

from rl_train.engines.training.megatron.schedule import check_right_padded, split_batch


def test_a_batch_with_padding_inside_a_row_is_refused() -> None:
    check_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"rows \[1\] have padding inside"):
        check_right_padded(torch.tensor([[1, 1, 0], [0, 1, 1]]))


def test_micro_batches_are_consecutive_rows() -> None:
    batch = {"input_ids": torch.arange(10).view(5, 2)}
    parts = split_batch(batch, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert torch.cat([p["input_ids"] for p in parts]).equal(batch["input_ids"])

