"""The schedule helpers in-process: right padding is checked, micro-batches are consecutive
rows. (The schedules themselves against HF: ``test_megatron_cpu.py``.)"""

from __future__ import annotations

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import pytest
import torch

from rl_train.engines.training.megatron.schedule import check_right_padded, split_batch, token_outputs


def test_a_batch_with_padding_inside_a_row_is_refused() -> None:
    check_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"rows \[1\] have padding inside"):
        check_right_padded(torch.tensor([[1, 1, 0], [0, 1, 1]]))


def test_micro_batches_are_consecutive_rows() -> None:
    batch = {"input_ids": torch.arange(10).view(5, 2)}
    parts = split_batch(batch, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert torch.cat([p["input_ids"] for p in parts]).equal(batch["input_ids"])



def test_token_outputs_give_the_student_log_probs_at_a_teachers_top_k() -> None:
    """Over the real vocabulary only (the tensor-parallel padding columns dropped), at the
    temperature, position t from the logits at t - 1, as ``log_probs``."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=generator)
    logits[..., 9:] = 50.0  # padding columns: they would swamp the softmax if kept
    input_ids = torch.randint(0, 9, (2, 5), generator=generator)
    topk_ids = torch.randint(0, 9, (2, 5, 3), generator=generator)
    out = token_outputs(logits, input_ids, 0.7, 9, False, topk_ids)
    full = torch.log_softmax(logits[..., :9].double() / 0.7, dim=-1)
    got = out["student_topk_log_probs"]
    assert got.shape == (2, 5, 3) and not got[:, 0].any()
    for t in range(1, 5):
        want = full[:, t - 1].gather(-1, topk_ids[:, t])
        torch.testing.assert_close(got[:, t].double(), want, atol=1e-6, rtol=0)
    at_sampled = token_outputs(logits, input_ids, 0.7, 9, False, input_ids.unsqueeze(-1))
    torch.testing.assert_close(at_sampled["student_topk_log_probs"][..., 0], out["log_probs"], atol=0, rtol=0)
    assert "student_topk_log_probs" not in token_outputs(logits, input_ids, 0.7, 9, False)
