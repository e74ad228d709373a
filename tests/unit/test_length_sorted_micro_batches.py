"""``actor.sort_by_length``: rows of like length share a micro-batch, cut where the padding
saved outweighs a micro-batch's cost; log-probs come back in the batch's order and the
update's gradients are those of the batch's own order, up to float rounding."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from pydantic import ValidationError

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.micro_batch import length_sorted_micro_batches, padding_cuts
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate


def _cost(lengths: list[int], ranges: list[tuple[int, int]], overhead: int) -> int:
    return sum((hi - lo) * lengths[hi - 1] + overhead for lo, hi in ranges)


def _check_cover(ranges: list[tuple[int, int]], rows: int, cap: int | None) -> None:
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(0 < hi - lo <= (cap or rows) for lo, hi in ranges)


def test_a_multi_turn_batch_is_cut_at_the_length_jump() -> None:
    lengths = sorted([129] * 20 + [131] * 40 + [169] * 4)
    assert padding_cuts(lengths) == [(0, 60), (60, 64)]
    assert padding_cuts(lengths, max_rows=32) == [(0, 32), (32, 60), (60, 64)]
    assert padding_cuts([40] * 10) == [(0, 10)]  # one length: no cut pays
    assert padding_cuts([40] * 10, max_rows=4) == [(0, 4), (4, 8), (8, 10)]
    assert padding_cuts([10, 11, 12], overhead_tokens=1000) == [(0, 3)]
    assert padding_cuts([]) == []


@pytest.mark.parametrize("cap", [None, 1, 3])
def test_the_cuts_are_the_cheapest_cover_of_the_runs(cap: int | None) -> None:
    rng = random.Random(cap or 0)
    for _ in range(60):
        lengths = sorted(rng.choice([5, 6, 9, 20, 21, 40]) for _ in range(rng.randint(1, 9)))
        overhead = rng.choice([0, 3, 30])
        got = padding_cuts(lengths, cap, overhead)
        _check_cover(got, len(lengths), cap)
        best = min(  # every way of cutting the rows into ranges within the cap
            _cost(lengths, ranges, overhead)
            for cuts in itertools.product([False, True], repeat=len(lengths) - 1)
            for ranges in [_ranges(cuts, len(lengths))]
            if all(hi - lo <= (cap or len(lengths)) for lo, hi in ranges)
        )
        assert _cost(lengths, got, overhead) == best, (lengths, cap, overhead, got)


@pytest.mark.parametrize("cap", [None, 3, 64])
def test_a_batch_of_thousands_of_lengths_is_cut_within_the_cap_at_a_cost_near_the_best(cap: int | None) -> None:
    rng = random.Random(7)
    lengths = sorted(rng.randint(20, 4000) for _ in range(3000))  # ~2,000 distinct lengths
    got = padding_cuts(lengths, cap, 64)
    _check_cover(got, len(lengths), cap)
    whole = _cost(lengths, [(lo, min(lo + (cap or len(lengths)), len(lengths))) for lo in range(0, len(lengths), cap or len(lengths))], 64)
    cost = _cost(lengths, got, 64)
    assert cost <= whole  # never worse than cutting the sorted rows by count alone
    assert cost < 1.15 * sum(lengths)  # and near the real tokens
    if cap is None:
        assert cost < 0.7 * whole  # far below one micro-batch padded to the longest row


def _ranges(cuts: tuple[bool, ...], rows: int) -> list[tuple[int, int]]:
    bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], rows]
    return list(itertools.pairwise(bounds))


def test_the_micro_batches_hold_the_rows_in_the_returned_order() -> None:
    lengths = [7, 3, 9, 3, 7, 12, 3]
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ids = (torch.arange(len(lengths))[:, None] * 100 + torch.arange(width) + 1) * mask
    batch = {"input_ids": ids, "attention_mask": mask, "scores": torch.arange(len(lengths)).float()}
    for rows, budget in [(None, None), (2, None), (None, 20)]:
        micro, order = length_sorted_micro_batches(batch, rows, budget)
        assert sorted(order.tolist()) == list(range(len(lengths)))
        assert [lengths[i] for i in order.tolist()] == sorted(lengths)
        joined = torch.cat([torch.nn.functional.pad(m["input_ids"], (0, width - m["input_ids"].shape[1])) for m in micro])
        assert torch.equal(joined, ids[order])
        assert torch.equal(torch.cat([m["scores"] for m in micro]), batch["scores"][order])
        for m in micro:  # each trimmed to its own longest row
            assert m["input_ids"].shape[1] == int(m["attention_mask"].sum(-1).max())
            if rows:
                assert m["input_ids"].shape[0] <= rows


def _mixed_batch(engine: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    """Right-padded rows of three lengths, interleaved: what a multi-turn batch looks like."""
    generator = torch.Generator().manual_seed(0)
    records = []
    for i in range(18):
        prompt = torch.randint(4, 40, (4 + i % 3,), generator=generator).tolist()
        response = torch.randint(4, 40, ((5, 22, 9)[i % 3],), generator=generator).tolist()
        records.append(
            {
                "prompt_ids": [engine.tokenizer.bos_token_id, *prompt],
                "response_ids": response,
                "old_log_probs": [-3.0] * len(response),
                "advantages": [((i % 5) - 2) / 2.0] * len(response),
            }
        )
    return collate(records, int(engine.tokenizer.pad_token_id), ["old_log_probs", "advantages"])


@pytest.mark.parametrize("rows", [None, 4])
def test_sorted_passes_give_the_batch_order_log_probs_and_gradients(tiny_model_dir, rows: int | None) -> None:
    plain = ActorConfig(infer_micro_batch_size=rows, micro_batch_size=rows)
    sorted_cfg = ActorConfig(infer_micro_batch_size=rows, micro_batch_size=rows, sort_by_length=True)
    engine = TorchTrainingEngine(tiny_model_dir, plain, 10)
    batch = _mixed_batch(engine)
    _, order = length_sorted_micro_batches(batch, rows, None)
    assert not torch.equal(order, torch.arange(len(order)))  # the test batch is out of order

    expected = engine.compute_log_probs(batch, with_entropy=True)
    engine.cfg = sorted_cfg
    got = engine.compute_log_probs(batch, with_entropy=True)
    real = batch["attention_mask"].bool()  # past a row's end each pass leaves what its width gives
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(got[key][real], expected[key][real], rtol=0, atol=1e-5)
    assert got["log_probs"].shape == batch["input_ids"].shape

    loss_fn = build_actor_loss_fn(plain)
    grads, metrics = {}, {}
    for name, cfg in (("plain", plain), ("sorted", sorted_cfg)):
        engine.cfg = cfg
        engine.optimizer.zero_grad(set_to_none=True)
        metrics[name] = engine.forward_backward_batch(batch, loss_fn, forward_only=False)
        grads[name] = {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    assert metrics["sorted"]["actor/loss"] == pytest.approx(metrics["plain"]["actor/loss"], rel=1e-5, abs=1e-7)
    for name, grad in grads["plain"].items():
        torch.testing.assert_close(grads["sorted"][name], grad, rtol=1e-4, atol=1e-6)
    if rows is None:  # three lengths, far apart: the sorted update is cut, the plain one is not
        assert metrics["plain"]["actor/num_micro_batches"] == 1
        assert metrics["sorted"]["actor/num_micro_batches"] > 1


def test_sort_by_length_is_refused_for_an_engine_that_cuts_its_own() -> None:
    with pytest.raises(ValidationError, match="actor.sort_by_length .* 'megatron'"):
        ActorConfig(engine="megatron", sort_by_length=True)


@pytest.mark.parametrize("loss", ["clip_cov", "kl_cov"])
def test_sort_by_length_is_refused_for_losses_with_per_micro_batch_statistics(loss: str) -> None:
    with pytest.raises(ValidationError, match=f"actor.policy_loss '{loss}' takes its statistics per micro-batch"):
        ActorConfig(policy_loss=loss, sort_by_length=True)
    ActorConfig(policy_loss=loss)  # without sorting it stands
