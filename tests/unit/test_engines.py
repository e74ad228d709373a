"""The built-in torch engines' own behaviour (the shared contract is in test_engine_conformance.py):
split-independent gradients per aggregation mode, token budgets, HF names, sparse loads,
seeded sampling, KV-cache release and where a sleeping CPU engine keeps its weights."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import EngineStateError, GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate


def _requests(engine: TorchRolloutEngine, count: int) -> list[GenerationRequest]:
    prompts = [f"{i % 10}+{(3 * i) % 10}=" if i % 3 else f"{i}+{i * 7}=" for i in range(count)]
    return [
        GenerationRequest(
            str(i), [engine.tokenizer.bos_token_id, *engine.tokenizer.encode(p, add_special_tokens=False)]
        )
        for i, p in enumerate(prompts)
    ]


def _records(results, advantages: bool = False) -> list[dict]:
    out = []
    for i, r in enumerate(results):
        rec = {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "old_log_probs": r.log_probs}
        if advantages:
            rec["advantages"] = [((i % 5) - 2) / 2.0] * len(r.response_ids)
        out.append(rec)
    return out


def _grads(engine: TorchTrainingEngine, batch, cfg: ActorConfig) -> tuple[dict[str, torch.Tensor], float]:
    engine.optimizer.zero_grad(set_to_none=True)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), forward_only=False)
    return {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}, metrics[
        "actor/loss"
    ]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradients_do_not_depend_on_the_micro_batch_split(tiny_model_dir, mode: str) -> None:
    rollout = TorchRolloutEngine(tiny_model_dir, seed=1)
    records = _records(rollout.generate(_requests(rollout, 24), SamplingParams(1.0, 1.0, 6)), advantages=True)
    for rec in records:  # a policy a little away from pi_old so the ratio is not exactly 1
        rec["old_log_probs"] = [x - 0.05 for x in rec["old_log_probs"]]
    batch = collate(records, 0, ["old_log_probs", "advantages"])
    whole = ActorConfig(loss_agg_mode=mode)
    split = ActorConfig(loss_agg_mode=mode, micro_batch_size=6)
    grads_1, loss_1 = _grads(TorchTrainingEngine(tiny_model_dir, whole, 10), batch, whole)
    engine_4 = TorchTrainingEngine(tiny_model_dir, split, 10)
    grads_4, loss_4 = _grads(engine_4, batch, split)
    assert (
        engine_4.forward_backward_batch(batch, build_actor_loss_fn(split), False)["actor/num_micro_batches"]
        == 4
    )
    assert loss_1 == pytest.approx(loss_4, abs=1e-6)
    assert any(g.abs().max() > 0 for g in grads_1.values())
    for name, grad in grads_1.items():
        torch.testing.assert_close(grads_4[name], grad, atol=1e-6, rtol=1e-5)


def test_token_budget_micro_batches(tiny_model_dir) -> None:
    rollout = TorchRolloutEngine(tiny_model_dir, seed=1)
    records = _records(rollout.generate(_requests(rollout, 16), SamplingParams(1.0, 1.0, 6)), advantages=True)
    batch = collate(records, 0, ["old_log_probs", "advantages"])
    cfg = ActorConfig(max_tokens_per_micro_batch=40)
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), False)
    widest = int(batch["attention_mask"].sum(-1).max())
    assert metrics["actor/num_micro_batches"] >= (16 * widest) // 40 // 2


def test_training_step_changes_weights_and_export_uses_hf_names(tiny_model_dir) -> None:
    cfg = ActorConfig(lr=1e-2)
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    rollout = TorchRolloutEngine(tiny_model_dir)
    records = _records(rollout.generate(_requests(rollout, 8), SamplingParams(1.0, 1.0, 4)), advantages=True)
    before = {k: v.clone() for k, v in engine.export_weights()}
    metrics = engine.train_batch(
        collate(records, 0, ["old_log_probs", "advantages"]), build_actor_loss_fn(cfg)
    )
    after = dict(engine.export_weights())
    assert set(before) == set(rollout.model.state_dict())
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rollout.update_weights(after.items(), version=7)
    assert rollout.version == 7
    for name, tensor in rollout.model.state_dict().items():
        torch.testing.assert_close(tensor, after[name])


@pytest.mark.parametrize("asleep", [False, True])
def test_sparse_updates_overwrite_only_the_given_entries(tiny_model_dir, asleep: bool) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    before = {name: t.detach().clone() for name, t in engine.model.state_dict().items()}
    name = next(iter(before))
    index = torch.tensor([0, 3, before[name].numel() - 1], dtype=torch.int32)
    values = torch.tensor([1.5, -2.0, 7.0], dtype=before[name].dtype)
    if asleep:
        engine.sleep()
    engine.update_weights_sparse([(name, index, values)], version=5)
    with pytest.raises(KeyError, match="update_weights_sparse: .* no tensor named 'nope'"):
        engine.update_weights_sparse([("nope", index, values)], version=6)
    if asleep:
        engine.wake_up()
    after = engine.model.state_dict()
    expected = before[name].clone()
    expected.view(-1)[index.long()] = values
    assert torch.equal(after[name], expected)
    untouched = [other for other in before if after[other].data_ptr() != after[name].data_ptr()]  # not tied
    assert untouched and all(torch.equal(after[other], before[other]) for other in untouched)
    assert engine.version == 5


def test_seeded_sampling_repeats_and_ignore_eos_fills_the_budget(tiny_model_dir) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    reqs = _requests(engine, 8)

    def ids(seed: int | None, max_new_tokens: int = 6, ignore_eos: bool = False) -> list[list[int]]:
        params = SamplingParams(1.0, 1.0, max_new_tokens, seed=seed, ignore_eos=ignore_eos)
        return [r.response_ids for r in engine.generate(reqs, params)]

    assert ids(1) == ids(1) != ids(2)
    assert ids(None) != ids(None)  # the engine's own stream moves on
    assert any(row[-1] == engine.eos_token_id and len(row) < 12 for row in ids(3, 12))
    assert all(len(row) == 12 for row in ids(3, 12, ignore_eos=True))


def test_release_kv_cache_waits_until_no_batch_decodes(tiny_model_dir) -> None:
    """The weight-sync quiesce: in-flight requests are aborted, and the call returns only once
    no batch (and so no KV cache) is left; generation is refused until resume_kv_cache."""
    engine = TorchRolloutEngine(tiny_model_dir)
    out: list = []
    params = SamplingParams(1.0, 1.0, 240, ignore_eos=True)
    worker = threading.Thread(target=lambda: out.extend(engine.generate(_requests(engine, 4), params)))
    worker.start()
    deadline = time.time() + 20
    while engine._in_flight == 0 and time.time() < deadline:
        time.sleep(0.002)
    engine.release_kv_cache()
    assert engine._in_flight == 0
    worker.join(timeout=20)
    assert [r.stop_reason for r in out] == ["aborted"] * 4
    with pytest.raises(EngineStateError, match="released"):
        engine.generate(_requests(engine, 1), params)
    engine.resume_kv_cache()
    assert len(engine.generate(_requests(engine, 1), SamplingParams(1.0, 1.0, 2))[0].response_ids) <= 2


def test_a_sleeping_cpu_engine_keeps_its_weights_where_they_are(tiny_model_dir) -> None:
    """On CPU the host is the device: an offload would copy the weights within the same
    memory, so sleep leaves every storage in place (and wake_up copies nothing)."""
    engine = TorchRolloutEngine(tiny_model_dir)
    where = {name: p.data_ptr() for name, p in engine.model.named_parameters()}
    engine.sleep()
    assert {name: p.data_ptr() for name, p in engine.model.named_parameters()} == where
    engine.wake_up()
    assert {name: p.data_ptr() for name, p in engine.model.named_parameters()} == where


def test_a_right_padded_batch_gives_the_log_probs_of_its_explicit_mask(tiny_model_dir) -> None:
    """The training engine drops the mask of a right-padded batch (causal attention alone hides
    the padding that follows each row's tokens): the same log-probs, bit for bit, as the
    model given the mask; a left-padded batch keeps its mask."""
    from rl_train.engines.training.token_outputs import token_log_probs

    engine = TorchTrainingEngine(tiny_model_dir, ActorConfig(), horizon_steps=1)
    records = [
        {"prompt_ids": [1, 5, 6], "response_ids": [7, 8, 9, 2]},
        {"prompt_ids": [1, 5], "response_ids": [7]},
        {"prompt_ids": [1, 6, 6, 6], "response_ids": [8, 2]},
    ]
    batch = collate(records, engine.tokenizer.pad_token_id)
    assert not bool(batch["attention_mask"].all())  # some rows are padded
    mask = batch["attention_mask"]
    with torch.no_grad():
        explicit = engine.model(
            input_ids=batch["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    expected = token_log_probs(explicit, batch["input_ids"], 1.0)
    got = engine.compute_log_probs(batch)["log_probs"]
    real = batch["response_mask"].bool()
    assert torch.equal(got[real], expected[real])
    left = {k: v.flip(-1) for k, v in batch.items()}  # padding first: the mask must stay
    with torch.no_grad():
        masked = engine.model(
            input_ids=left["input_ids"], attention_mask=left["attention_mask"],
            position_ids=(left["attention_mask"].cumsum(-1) - 1).clamp(min=0),
        ).logits  # fmt: skip
    assert torch.equal(engine.compute_log_probs(left)["log_probs"], token_log_probs(masked, left["input_ids"], 1.0))
